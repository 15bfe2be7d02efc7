"""samebits check against `samebits serve` on the CPU with a tiny random model: fast mode is the negative control
(it must be reported variant), deterministic mode must be clean.

Why these shapes: in fast mode the CPU linears are MKL sgemm calls whose blocking follows the number of rows in the
batch, so a row's sums are reordered when other requests join it; but a reordering moves a float32 sum only in
some cases, and with prompts of a handful of tokens the needle can come out equal by chance. An 8-word needle
(about 40 byte-level tokens of the tiny tokenizer) decoding 8 tokens among fillers of 2-12 words diverged in every
burst of 4 and 8 when checked by hand (|Δlogprob| about 5e-7). The fast assertion is on the whole run (any
experiment variant); the deterministic assertion is on every experiment, unweakened.
"""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from samebits.check import run
from tests.subprocess_server import free_port, wait_healthy

pytest.importorskip("fastapi")  # the server stack is an extra; without it there is no server to check
pytest.importorskip("uvicorn")

STARTUP_S = 120
SHAPES = {"concurrency": (1, 4, 8), "trials": 2, "max_tokens": 8, "needle_words": 8, "filler_words": (2, 12),
          "prefix_words": 24, "quiet": True}


@pytest.fixture(scope="module")
def servers(tmp_path_factory):
    from samebits.models.synthetic import write_tiny_checkpoint

    model = write_tiny_checkpoint(tmp_path_factory.mktemp("check-tiny"), variant="llama3", seed=0)
    procs, urls = [], {}
    try:
        for mode in ("fast", "deterministic"):  # both start at once: their startups overlap
            port = free_port()
            cmd = [sys.executable, "-m", "samebits", "serve", "--model", str(model), "--served-model-name", "tiny",
                   "--mode", mode, "--port", str(port), "--device", "cpu", "--log-level", "warning"]
            procs.append(subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
            urls[mode] = f"http://127.0.0.1:{port}"
        for proc, url in zip(procs, urls.values()):
            wait_healthy(proc, url, STARTUP_S)
        yield urls
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def checked(url: str, tmp_path: Path, seed: int) -> tuple[int, dict]:
    path = tmp_path / "report.json"
    code = run(url, json_path=path, seed=seed, **SHAPES)
    return code, json.loads(path.read_text())


def test_fast_mode_is_reported_variant(servers, tmp_path, seed):
    code, report = checked(servers["fast"], tmp_path, seed)
    assert code == 1 and report["verdict"] == "variant", [(e["name"], e["status"]) for e in report["experiments"]]
    needle = next(e for e in report["experiments"] if e["name"] == "needle")
    assert needle["groups"][0]["diverged"] == 0  # N=1: the needle alone again equals the needle alone
    assert report["endpoint"]["headers"]["x-samebits-mode"] == {"fast": report["requests"]}


def test_deterministic_mode_is_clean(servers, tmp_path, seed):
    code, report = checked(servers["deterministic"], tmp_path, seed)
    got = {e["name"]: e["status"] for e in report["experiments"]}
    # Prefill vs decode runs through echo with logprobs: every generated token's logprob as a prompt token's.
    assert got == {"needle": "clean", "sampled": "clean", "prefix": "clean", "prefill": "clean", "repeat": "clean"}
    prefill = next(e for e in report["experiments"] if e["name"] == "prefill")
    assert prefill["method"] == "echo+logprobs" and prefill["groups"], prefill
    assert code == 0 and report["verdict"] == "clean"
    assert all(g["diverged"] == 0 and g["unique_outputs"] == 1 for e in report["experiments"] for g in e["groups"])
    assert report["references"][0]["sample"]["identity"] == "token_ids"
    assert len(report["endpoint"]["system_fingerprints"]) == 1


def test_plugin_gates_pytest_on_the_fast_server(servers, tmp_path):
    args = "--concurrency 1,4,8 --trials 2 --max-tokens 8 --needle-words 8 --filler-words 2,12 --prefix-words 24"
    cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-p",
           "samebits.check.pytest_plugin", "--samebits-args", args, "--rootdir", str(tmp_path)]
    procs = {mode: subprocess.Popen([*cmd, "--samebits-url", url], cwd=tmp_path, stdout=subprocess.PIPE,
                                    stderr=subprocess.STDOUT, text=True) for mode, url in servers.items()}
    out = {mode: proc.communicate(timeout=120)[0] for mode, proc in procs.items()}
    assert procs["deterministic"].returncode == 0, out["deterministic"][-2000:]
    assert procs["fast"].returncode == 1 and "is batch-variant" in out["fast"], out["fast"][-2000:]
