"""samebits/benchmarks/fairness.py on the CPU at toy size, so the GPU run does not meet its first bug there."""
from __future__ import annotations

import json

from samebits.benchmarks import fairness as bench


def test_fairness_benchmark_smoke(tmp_path):
    """A short request behind a 100-token prompt at a 32-token budget: the next step under the default cap, several
    steps later with the cap off (the negative control, in the same run)."""
    argv = ["--device", "cpu", "--shape", "tiny", "--modes", "deterministic", "--budget", "32", "--prompt-tokens",
            "100", "--decode-rows", "1", "--prompt-len", "4", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = {r["threshold"]: r for r in json.loads((tmp_path / "fairness.json").read_text())["rows"]}
    assert rows["default"]["short_ttft_steps"] == 1 and rows[0]["short_ttft_steps"] > 1, rows
    assert all(r["long_step_ms"] > 0 and r["long_ttft_ms"] >= r["short_ttft_ms"] for r in rows.values())
    assert (tmp_path / "fairness.png").stat().st_size > 0
