"""samebits/benchmarks/spec.py on the CPU at toy size, so the GPU run does not meet its first bug there."""
from __future__ import annotations

import json

from samebits.benchmarks import spec as bench


def test_spec_benchmark_smoke(tmp_path):
    argv = ["--device", "cpu", "--shape", "tiny", "--batches", "1", "--tokens", "6", "--prompt-len", "8", "--rates",
            "1", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = json.loads((tmp_path / "spec.json").read_text())["rows"]
    assert [r["drafter"] for r in rows] == ["replay@1", "random", "random-always", "ngram"]
    assert all(r["same_bits"] for r in rows)
    assert rows[0]["acceptance_rate"] == 1.0 and rows[1]["acceptance_rate"] == 0.0
    assert (tmp_path / "spec.png").stat().st_size > 0


def test_per_token_keep_gives_the_asked_acceptance_rate():
    k = 4
    p = bench.per_token_keep(0.8, k)
    assert abs(sum(p ** i for i in range(1, k + 1)) / k - 0.8) < 1e-9
