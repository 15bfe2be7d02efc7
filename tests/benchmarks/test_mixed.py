"""samebits/benchmarks/mixed.py on the CPU at toy size, so the GPU run does not meet its first bug there."""
from __future__ import annotations

import json

import pytest

from samebits.benchmarks import mixed as bench


def test_mixed_benchmark_smoke(tmp_path):
    argv = ["--device", "cpu", "--shape", "tiny", "--modes", "deterministic", "--decode-rows", "3",
            "--prefill-tokens", "24", "--prompt-len", "8", "--repeat", "1", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    rows = json.loads((tmp_path / "mixed.json").read_text())["rows"]
    assert [(r["decode_rows"], r["prefill_tokens"]) for r in rows] == [(3, 24)]
    assert all(r["mixed_ms"] > 0 and r["ratio"] == r["mixed_ms"] / (r["decode_ms"] + r["prefill_ms"]) for r in rows)
    assert (tmp_path / "mixed.png").stat().st_size > 0


def test_a_step_of_the_wrong_kind_is_refused():
    """Negative control: a 'decode alone' measurement whose step launched a prefill fails loudly, naming the kinds."""
    with pytest.raises(RuntimeError, match=r"launched \['prefill'\] steps, not 'decode'"):
        bench.median_of([(9.0, "prefill"), (1.0, "decode"), (1.0, "prefill")], "decode", "decode rows alone")
