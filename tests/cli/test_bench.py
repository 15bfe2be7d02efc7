"""`samebits bench` end to end on the CPU (tiny random shape, two requests), and its flags' errors."""
import json

import pytest
from typer.testing import CliRunner

from samebits.cli import app

TINY = ["bench", "--random-shape", "tiny", "--device", "cpu", "--requests", "2", "--prompt-tokens", "4", "16",
        "--output-tokens", "2", "4", "--rerun-alone", "2", "--seed", "5"]


def test_bench_prints_the_table_and_writes_the_report(tmp_path):
    path = tmp_path / "bench.json"
    res = CliRunner().invoke(app, [*TINY, "--mode", "deterministic", "--json", str(path)])
    assert res.exit_code == 0, res.output
    assert "alone≠loaded" in res.output and "roofline n/a" in res.output
    report = json.loads(path.read_text())
    assert report["modes"]["deterministic"]["alone_vs_loaded_mismatches"] == 0
    assert report["config"]["prompt_tokens"] == [4, 16] and "deterministic_tax" not in report


def test_a_step_budget_below_the_prompts_chunks_them_and_keeps_the_bits(tmp_path):
    """--max-num-batched-tokens is the engine's step budget: 4 tokens a step prefill every prompt in chunks."""
    path = tmp_path / "bench.json"
    res = CliRunner().invoke(app, [*TINY, "--mode", "deterministic", "--max-num-batched-tokens", "4", "--json",
                                   str(path)])
    assert res.exit_code == 0, res.output
    report = json.loads(path.read_text())
    det = report["modes"]["deterministic"]
    assert report["config"]["max_num_batched_tokens"] == 4 and det["alone_vs_loaded_mismatches"] == 0
    assert det["steps"]["steps"] > report["workload"]["prompt_tokens"] // 4


@pytest.mark.parametrize("flags,message", [
    (["--requests", "0"], "--requests must be an int in [1, 65536], got 0"),
    (["--max-num-batched-tokens", "0"], "--max-num-batched-tokens must be an int in [1, 1048576], got 0"),
    (["--prompt-tokens", "16", "4"], "--prompt-tokens MAX must be an int in [16, 1048576], got 4"),
    (["--mode", "slow"], "--mode must be one of deterministic, fast, both"),
    (["--device", "tpu"], "unknown device 'tpu'; use cpu or cuda"),
    (["--output-tokens", "4", "5000"], "--output-tokens MAX 5000 = 5016 exceeds the model's context of 4096"),
    (["--json", "/nonexistent/dir/b.json"], "cannot write /nonexistent/dir/b.json: no directory"),
])
def test_bad_flag_is_one_line_naming_it(flags, message):
    res = CliRunner().invoke(app, [*TINY, *flags])
    assert res.exit_code == 2 and message in res.output and "Traceback" not in res.output, res.output
