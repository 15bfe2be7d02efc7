"""`samebits rl-demo` in miniature: per step the samebits trainer is exactly on-policy and the stock-kernel trainer
sets the alarm off; the PNG and the JSON are written; bad flags are refused in one line."""
import json

import pytest
from typer.testing import CliRunner

from samebits.cli.main import app


def test_two_steps_side_by_side(tmp_path):
    png, out = tmp_path / "rl.png", tmp_path / "rl.json"
    result = CliRunner().invoke(app, ["rl-demo", "--steps", "2", "--prompts", "2", "--group", "4", "--max-tokens", "4",
                                      "--plot", str(png), "--json", str(out)])
    assert result.exit_code == 0, result.output
    runs = json.loads(out.read_text())
    for rec in runs["samebits"]:
        p = rec["parity"]
        assert not rec["alarm"] and p["bitwise_equal"] == 1.0 and p["kl_k3"] == 0.0
        assert p["ratio_min"] == p["ratio_max"] == 1.0
    for rec in runs["stock"]:
        assert rec["alarm"] and rec["parity"]["bitwise_equal"] < 1.0 and rec["parity"]["kl_k3"] > 0.0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "samebits: reward" in result.output and "alarms on 0 of 2 steps" in result.output


@pytest.mark.parametrize("flags, message", [(["--group", "1"], "--group must be >= 2, got 1"),
                                            (["--lr", "0"], "--lr must be > 0, got 0.0")])
def test_bad_flags(flags, message):
    result = CliRunner().invoke(app, ["rl-demo", *flags])
    assert result.exit_code == 2 and message in result.output
