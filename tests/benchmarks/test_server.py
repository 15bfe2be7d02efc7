"""samebits/benchmarks/server.py on CPU at toy size, so the GPU run does not meet its first bug there."""
from __future__ import annotations

import json

from samebits.benchmarks import server, server_cpu
from samebits.models.synthetic import write_tiny_checkpoint


def test_server_benchmark_smoke(tmp_path):
    model = write_tiny_checkpoint(tmp_path / "tiny-llama", variant="llama3", seed=0)
    argv = ["--model", str(model), "--device", "cpu", "--requests", "6", "--input-len", "5", "20",
            "--output-len", "3", "6", "--max-num-seqs", "8", "--out", str(tmp_path)]
    assert server.main(argv) == 0
    report = json.loads((tmp_path / "server_bench.json").read_text())
    assert report["solo"]["checked"] == 6 and report["solo"]["mismatched"] == [] and report["failed"] == []
    assert report["output_tokens"] > 0 and report["fingerprint"]["hash"]
    assert report["offline"]["equal_to_server"] == 6, "the server answers as the offline engine does"
    assert (tmp_path / "server_bench.png").stat().st_size > 0


def test_server_cpu_benchmark_smoke(tmp_path):
    """server_cpu.py at toy size, both backends: every response checked against the replayed tokens."""
    argv = ["--requests", "4", "--output-len", "5", "--n", "2", "--logprobs", "2", "--step-ms", "2", "--repeat", "1",
            "--out", str(tmp_path)]
    assert server_cpu.main(argv) == 0
    runs = json.loads((tmp_path / "server_cpu.json").read_text())["runs"]
    assert [r["backend"] for r in runs] == ["thread", "process"]
    assert all(r["output_tokens"] == 4 * 2 * 5 and r["us_per_token"]["event loop"] > 0 for r in runs)
