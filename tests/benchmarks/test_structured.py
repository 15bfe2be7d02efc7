"""samebits/benchmarks/structured.py on the CPU at toy size, so the GPU run does not meet its first bug there."""
from __future__ import annotations

import json

from samebits.benchmarks import structured as bench
from samebits.structured.grammar import Grammars


def test_structured_benchmark_smoke(tmp_path):
    argv = ["--device", "cpu", "--shape", "tiny", "--modes", "deterministic", "--requests", "4", "--prompt-len", "8",
            "--max-tokens", "6", "--out", str(tmp_path)]
    assert bench.main(argv) == 0
    (row,) = json.loads((tmp_path / "structured.json").read_text())["rows"]
    assert row["tokens"] > 0 and row["grammar_steps"] > 0 and row["mean_rows"] > 0 and row["fill_ms_p50"] > 0
    assert (tmp_path / "structured.png").stat().st_size > 0


def test_the_synthetic_vocabulary_has_the_shapes_size_and_an_eos():
    tok = bench.synthetic_tokenizer(1024)
    assert tok.vocab_size == 1024 and tok.eos_token_ids == {1023}
    assert Grammars(tok, 1024).lltokenizer.vocab_size == 1024
