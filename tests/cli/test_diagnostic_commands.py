"""`samebits lint` and `samebits check` are reachable from the console script with their own exit codes."""
from typer.testing import CliRunner

from samebits.cli import app


def test_lint_exits_1_on_a_float_atomic_and_0_on_clean_code(tmp_path):
    bad = tmp_path / "k.cu"
    bad.write_text("__global__ void k(float* c, float v) { atomicAdd(c, v); }\n")
    good = tmp_path / "ok.cu"
    good.write_text("__global__ void k(int* c) { atomicAdd(c, 1); }\n")
    runner = CliRunner()
    hit = runner.invoke(app, ["lint", str(bad)])
    assert hit.exit_code == 1 and "SB101" in hit.output
    assert runner.invoke(app, ["lint", str(good)]).exit_code == 0


def test_check_passes_its_flags_through_and_exits_2_when_it_cannot_test():
    result = CliRunner().invoke(app, ["check", "http://127.0.0.1:9", "--max-wall-s", "5"])
    assert result.exit_code == 2
