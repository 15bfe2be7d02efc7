"""The typer command samebits.cli registers, run through typer on an app of its own (samebits.cli is being moved)."""
import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from samebits.lint.command import lint_command
from samebits.lint.rules import markdown_table

CORPUS = Path(__file__).parent / "lint_corpus"
app = typer.Typer()
app.command("lint")(lint_command)
app.command("other")(lambda: None)  # with two commands, typer keeps `lint` as a subcommand, as in samebits.cli


def invoke(*args):
    return CliRunner().invoke(app, ["lint", *args])


def test_command_lints_and_exits_with_the_verdict():
    res = invoke("--format", "json", str(CORPUS / "SB301_pos.py"), str(CORPUS / "SB101_neg.cu"))
    assert res.exit_code == 1
    assert {f["rule"] for f in json.loads(res.stdout)["findings"]} == {"SB301"}
    assert invoke(str(CORPUS / "SB301_neg.py")).exit_code == 0


def test_command_takes_compiled_files_and_prints_rules():
    assert invoke("--compiled", str(CORPUS / "SB401_pos.ptx"), "--compiled", str(CORPUS / "SB403_neg.txt")).exit_code == 1
    res = invoke("--rules")
    assert res.exit_code == 0 and res.stdout.strip() == markdown_table()


def test_command_help_comes_from_the_argument_description():
    res = invoke("--help")
    assert res.exit_code == 0 and "--compiled" in res.stdout and "--triton" in res.stdout
