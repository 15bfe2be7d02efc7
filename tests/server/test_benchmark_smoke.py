"""benchmarks/server.py on CPU at toy size, so the GPU run does not meet its first bug there."""
from __future__ import annotations

import importlib
import json
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_bench():
    # By its importable name (benchmarks/ is a namespace package from the repository root): the benchmark's client
    # runs in a spawned process, which must import the module to unpickle its function.
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    return importlib.import_module("benchmarks.server")


def test_server_benchmark_smoke(tmp_path, tiny_model_dir):
    bench = load_bench()
    argv = ["--model", str(tiny_model_dir), "--device", "cpu", "--requests", "6", "--input-len", "5", "20",
            "--output-len", "3", "6", "--max-num-seqs", "8", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    report = json.loads((tmp_path / "server_bench.json").read_text())
    assert report["solo"]["checked"] == 6 and report["solo"]["mismatched"] == [] and report["failed"] == []
    assert report["output_tokens"] > 0 and report["fingerprint"]["hash"]
    assert report["offline"]["equal_to_server"] == 6, "the server answers as the offline engine does"
    assert (tmp_path / "server_bench.png").stat().st_size > 0


def test_server_cpu_benchmark_smoke(tmp_path):
    """benchmarks/server_cpu.py at toy size, both backends: every response checked against the replayed tokens."""
    if str(ROOT) not in sys.path:
        sys.path.insert(0, str(ROOT))
    bench = importlib.import_module("benchmarks.server_cpu")
    argv = ["--requests", "4", "--output-len", "5", "--n", "2", "--logprobs", "2", "--step-ms", "2", "--repeat", "1",
            "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    runs = json.loads((tmp_path / "server_cpu.json").read_text())["runs"]
    assert [r["backend"] for r in runs] == ["thread", "process"]
    assert all(r["output_tokens"] == 4 * 2 * 5 and r["us_per_token"]["event loop"] > 0 for r in runs)
