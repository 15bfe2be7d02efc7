"""The `samebits lint` typer command, for samebits.cli to register: `app.command("lint")(lint_command)`.

Its help texts come from cli.ARGS, so the typer command and `python -m samebits.lint` cannot drift apart.
"""
from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from samebits.lint.cli import ARGS, run
from samebits.lint.report import FORMATS
from samebits.lint.rules import markdown_table

HELP = {a.flags[0]: a.help for a in ARGS}


def lint_command(
    paths: Annotated[list[Path] | None, typer.Argument(help=HELP["paths"], show_default=False)] = None,
    compiled: Annotated[list[Path] | None, typer.Option("--compiled", help=HELP["--compiled"])] = None,
    triton: Annotated[list[str] | None, typer.Option("--triton", help=HELP["--triton"])] = None,
    fmt: Annotated[str, typer.Option("--format", help=f"{HELP['--format']} One of: {', '.join(FORMATS)}.")] = "text",
    rules: Annotated[bool, typer.Option("--rules", help=HELP["--rules"])] = False,
):
    """Find what breaks determinism in CUDA, Triton and PyTorch code and compiled kernels; exit 1 on findings."""
    if rules:
        print(markdown_table())
        return
    raise typer.Exit(run(paths or [], compiled or [], triton or [], fmt))
