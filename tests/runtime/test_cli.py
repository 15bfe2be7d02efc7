"""The runtime half of the CLI: env --shell/--check, fingerprint across processes, lock and verify-lock, bad input."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from samebits.cli import app
from samebits.runtime import TEMPLATE_ENV

ROOT = Path(__file__).resolve().parents[2]


def run(*args):
    return CliRunner().invoke(app, list(args))


def assert_one_line_error(res):
    assert res.exit_code != 0
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    assert "Traceback" not in res.output
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output


def sh(cmd: str, env: dict | None = None) -> subprocess.CompletedProcess:
    base = {k: v for k, v in os.environ.items() if k not in TEMPLATE_ENV}
    return subprocess.run(["bash", "-c", cmd], capture_output=True, text=True, cwd=ROOT, env={**base, **(env or {})},
                          timeout=60, check=False)


@pytest.fixture
def template_env(monkeypatch):
    for k, v in TEMPLATE_ENV.items():
        monkeypatch.setenv(k, v)


def test_env_shell_prints_every_template_export():
    res = run("env", "--shell")
    assert res.exit_code == 0
    assert res.output.splitlines() == [f"export {k}={v}" for k, v in TEMPLATE_ENV.items()]


def test_env_check_passes_on_template(template_env):
    res = run("env", "--check")
    assert res.exit_code == 0, res.output
    assert "matches" in res.output


@pytest.mark.parametrize("value", [None, ":0:0", "4096:8"])
def test_env_check_names_a_missing_or_wrong_workspace_config(template_env, monkeypatch, value):
    if value is None:
        monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG")
    else:
        monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    res = run("env", "--check", "--device", "cuda")
    assert res.exit_code == 1
    assert "CUBLAS_WORKSPACE_CONFIG" in res.output and (value or "<unset>") in res.output
    assert "NCCL_ALGO" not in res.output, "only what is wrong belongs in the table"


def test_env_check_names_a_wrong_nccl_variable(template_env, monkeypatch):
    monkeypatch.setenv("NCCL_NVLS_ENABLE", "1")
    res = run("env", "--check", "--device", "cuda")
    assert res.exit_code == 1 and "NCCL_NVLS_ENABLE" in res.output


@pytest.fixture
def cuda_here(monkeypatch):
    """Pretend this machine has (True) or lacks (False) CUDA, as `env --check --device auto` sees it."""
    from samebits.models import loader

    def pretend(present: bool) -> None:
        monkeypatch.setattr(loader, "default_device", lambda: "cuda" if present else "cpu")

    return pretend


def test_env_check_without_cuda_checks_only_the_cpu_variables(monkeypatch, cuda_here):
    cuda_here(False)
    for k in TEMPLATE_ENV:
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("MKL_CBWR", TEMPLATE_ENV["MKL_CBWR"])
    res = run("env", "--check")
    assert res.exit_code == 0 and "matches" in res.output, res.output
    monkeypatch.delenv("MKL_CBWR")
    res = run("env", "--check", "--json")
    assert res.exit_code == 1 and [p["variable"] for p in json.loads(res.output)] == ["MKL_CBWR"]


def test_env_check_with_cuda_checks_every_variable(monkeypatch, cuda_here):
    cuda_here(True)
    for k in TEMPLATE_ENV:
        monkeypatch.delenv(k, raising=False)
    res = run("env", "--check", "--json")
    assert res.exit_code == 1 and [p["variable"] for p in json.loads(res.output)] == list(TEMPLATE_ENV)
    assert json.loads(run("env", "--check", "--json", "--device", "cpu").output) == [
        {"variable": "MKL_CBWR", "expected": TEMPLATE_ENV["MKL_CBWR"], "actual": "<unset>"}]


def test_every_template_variable_names_its_device():
    from samebits.runtime.template import ENV_DEVICE

    assert set(ENV_DEVICE) == set(TEMPLATE_ENV) and set(ENV_DEVICE.values()) == {"cpu", "cuda"}


def test_env_check_unknown_device_is_one_line_error():
    assert_one_line_error(run("env", "--check", "--device", "tpu"))


def test_shell_exports_fix_the_check_in_a_real_shell():
    py = sys.executable
    assert sh(f"{py} -m samebits env --check --device cuda").returncode == 1
    fixed = sh(f'eval "$({py} -m samebits env --shell)" && {py} -m samebits env --check --device cuda')
    assert fixed.returncode == 0, fixed.stdout + fixed.stderr


def test_fingerprint_hash_equal_across_fresh_processes():
    # Two processes at once: independent interpreters all the same, at half the wall time.
    procs = [subprocess.Popen([sys.executable, "-m", "samebits", "fingerprint", "--json"], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True, cwd=ROOT) for _ in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs[0][1]
    a, b = (json.loads(out) for out, _ in outs)
    assert a == b
    assert len(a["hash"]) == 16 and a["torch"] and a["cpu_threads"] >= 1
    # The deterministic fingerprint is taken inside the template, as serve and LLM run: MKL's mode is the pinned one.
    from samebits.kernels.cpu import mkl

    if mkl.available():
        assert a["mkl_cnr"] in ("AVX2,STRICT", "AUTO,STRICT"), a["mkl_cnr"]


def test_fingerprint_hash_depends_on_mode():
    a, b = (json.loads(run("fingerprint", "--json", "--mode", m).output) for m in ("fast", "deterministic"))
    assert a["hash"] != b["hash"]


def test_fingerprint_with_a_model_is_the_engines_system_fingerprint(tmp_path):
    from samebits.engine.llm import LLM
    from samebits.models.synthetic import write_tiny_checkpoint

    path = str(write_tiny_checkpoint(tmp_path, "llama3", seed=2))
    fp = json.loads(run("fingerprint", "--json", "--model", path, "--device", "cpu").output)
    engine = LLM(model=path, device="cpu", kv_cache_tokens=256).engine.fingerprint()
    assert fp["hash"] == engine["hash"] and fp["weights"] == engine["weights"] and fp["dtype"] == "float32"
    runtime = json.loads(run("fingerprint", "--json").output)
    assert "weights" not in runtime and runtime["hash"] != fp["hash"]  # negative control: the runtime's alone


def test_fingerprint_model_flags_refuse_bad_input(tmp_path):
    assert_one_line_error(run("fingerprint", "--model", str(tmp_path / "absent")))
    assert_one_line_error(run("fingerprint", "--dtype", "bf16"))


def test_lock_then_verify_is_clean(tmp_path):
    path = tmp_path / "samebits.lock"
    assert run("lock", str(path)).exit_code == 0
    res = run("verify-lock", str(path))
    assert res.exit_code == 0 and "no drift" in res.output


@pytest.mark.parametrize("field,value", [("torch", "0.0.1"), ("cpu_threads", 999), ("numerics_profile", "0" * 16)])
def test_verify_lock_names_an_edited_field(tmp_path, field, value):
    path = tmp_path / "samebits.lock"
    run("lock", str(path))
    locked = json.loads(path.read_text())
    locked[field] = value
    path.write_text(json.dumps(locked))
    res = CliRunner().invoke(app, ["verify-lock", str(path)], terminal_width=200)
    assert res.exit_code == 1
    assert field in res.output and str(value) in res.output


def test_verify_lock_reports_a_field_added_or_removed(tmp_path):
    path = tmp_path / "samebits.lock"
    run("lock", str(path))
    locked = json.loads(path.read_text())
    del locked["blas"]
    path.write_text(json.dumps(locked))
    res = CliRunner().invoke(app, ["verify-lock", str(path)], terminal_width=200)
    assert res.exit_code == 1 and "blas" in res.output


def test_lock_to_unwritable_path_is_one_line_error(tmp_path):
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert_one_line_error(run("lock", str(blocker / "samebits.lock")))
    assert_one_line_error(run("lock", str(tmp_path)))


def test_verify_missing_lock_is_one_line_error(tmp_path):
    assert_one_line_error(run("verify-lock", str(tmp_path / "nope.lock")))


@pytest.mark.parametrize("body", ["not json {", "[1, 2]", '"a string"'])
def test_verify_corrupt_lock_is_one_line_error(tmp_path, body):
    path = tmp_path / "samebits.lock"
    path.write_text(body)
    assert_one_line_error(run("verify-lock", str(path)))


def test_unknown_mode_is_one_line_error(tmp_path):
    assert_one_line_error(run("lock", str(tmp_path / "x.lock"), "--mode", "quick"))
    assert_one_line_error(run("fingerprint", "--mode", "quick"))


def test_env_check_and_verify_lock_speak_json(tmp_path, monkeypatch):
    import json as _json

    from typer.testing import CliRunner

    from samebits.cli import app

    monkeypatch.delenv("CUBLAS_WORKSPACE_CONFIG", raising=False)
    res = CliRunner().invoke(app, ["env", "--check", "--json", "--device", "cuda"])
    assert res.exit_code == 1
    assert "CUBLAS_WORKSPACE_CONFIG" in {p["variable"] for p in _json.loads(res.output)}
    lock = tmp_path / "samebits.lock"
    assert CliRunner().invoke(app, ["lock", str(lock)]).exit_code == 0
    clean = CliRunner().invoke(app, ["verify-lock", str(lock), "--json"])
    assert clean.exit_code == 0 and _json.loads(clean.output) == []
    edited = _json.loads(lock.read_text())
    edited["torch"] = "0.0.0"
    lock.write_text(_json.dumps(edited))
    drift = CliRunner().invoke(app, ["verify-lock", str(lock), "--json"])
    import torch

    assert drift.exit_code == 1
    assert _json.loads(drift.output) == [{"field": "torch", "locked": "0.0.0", "now": torch.__version__}]
