"""The `samebits lint` entry point, typer-free: `run()` for the CLI command, `main()` for `python -m`."""
from __future__ import annotations

import argparse
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from samebits.lint.compiled import check_file, check_triton
from samebits.lint.cuda_checker import check_cuda
from samebits.lint.findings import Finding
from samebits.lint.python_checker import check_python
from samebits.lint.report import FORMATS
from samebits.lint.rules import markdown_table

PYTHON = (".py",)
CUDA = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".h", ".hpp", ".hh", ".inl")
SKIP_DIRS = {".git", "__pycache__", ".venv", "node_modules", ".mypy_cache", ".pytest_cache"}
EXIT_CLEAN, EXIT_FINDINGS, EXIT_USAGE = 0, 1, 2


@dataclass(frozen=True)
class Arg:
    """One command-line argument, described once for both argparse (here) and the typer command (samebits.cli)."""
    flags: tuple[str, ...]
    help: str
    many: bool = False
    choices: tuple[str, ...] = ()
    default: object = None


ARGS = (
    Arg(("paths",), "Files or directories: .py through ast, .cu/.cuh/.cpp/.h through the CUDA tokenizer.", many=True),
    Arg(("--compiled",), "PTX or SASS text, a kernel-name list, or a cubin (needs cuobjdump or nvdisasm).", many=True),
    Arg(("--triton",), "A Triton kernel to compile for sm_90 and check: 'pkg.mod:kernel(x_ptr=*fp32, BLOCK=128)' "
        "(or 'path/file.py:kernel(...)').",
        many=True),
    Arg(("--format",), "Output format.", choices=tuple(FORMATS), default="text"),
    Arg(("--rules",), "Print the rule table as Markdown and exit."),
)


def iter_sources(paths: list[Path]) -> Iterator[Path]:
    """Source files under `paths`, in sorted order; FileNotFoundError for a path that does not exist, ValueError for a
    file named on its own that is no source (PTX, SASS and name lists go through --compiled)."""
    for p in paths:
        if not p.exists():
            raise FileNotFoundError(f"no such file or directory: {p}")
        if p.is_file():
            if p.suffix not in PYTHON + CUDA:
                raise ValueError(f"{p}: not a Python or CUDA source; give compiled kernels with --compiled")
            yield p
            continue
        for f in sorted(p.rglob("*")):
            if f.is_file() and f.suffix in PYTHON + CUDA and not SKIP_DIRS & set(f.relative_to(p).parts):
                yield f


def check_source(path: Path) -> list[Finding]:
    source = path.read_text(encoding="utf-8", errors="replace")
    if path.suffix in PYTHON:
        return check_python(str(path), source)
    return check_cuda(str(path), source)


def lint(paths: list[Path], compiled: list[Path] = (), triton: list[str] = ()) -> tuple[list[Finding], list[str]]:
    """Every finding in sources, compiled files and Triton specs, and the notes on what could not be checked."""
    found, notes = [], []
    for f in iter_sources(paths):
        try:
            found += check_source(f)
        except SyntaxError as e:
            notes.append(f"skipped {f}: not valid Python ({e.msg}, line {e.lineno})")
    for c in compiled:
        if not c.is_file():
            raise FileNotFoundError(f"no such file: {c}")
        more, why = check_file(c)
        found += more
        notes += why
    for spec in triton:
        found += check_triton(spec)
    return found, notes


def run(paths: list[Path], compiled: list[Path] = (), triton: list[str] = (), fmt: str = "text",
        out=None, err=None) -> int:
    """Lint, write the report in `fmt` to `out` and notes to `err` (stdout and stderr as they are at the call, which a
    test runner may have swapped); 0 clean, 1 findings, 2 bad input."""
    out, err = out or sys.stdout, err or sys.stderr
    if fmt not in FORMATS:
        print(f"error: unknown format {fmt!r}; use {', '.join(FORMATS)}", file=err)
        return EXIT_USAGE
    if not (paths or compiled or triton):
        print("error: nothing to lint; give paths, --compiled or --triton", file=err)
        return EXIT_USAGE
    try:
        found, notes = lint([Path(p) for p in paths], [Path(c) for c in compiled], list(triton))
    except (FileNotFoundError, ValueError) as e:
        print(f"error: {e}", file=err)
        return EXIT_USAGE
    for n in notes:
        print(f"note: {n}", file=err)
    print(FORMATS[fmt](found), file=out)
    return EXIT_FINDINGS if found else EXIT_CLEAN


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="samebits lint", description="Find what breaks determinism in kernel code.")
    for a in ARGS:
        if a.flags == ("--rules",):
            p.add_argument(*a.flags, action="store_true", help=a.help)
        elif a.many:
            p.add_argument(*a.flags, nargs="*" if a.flags[0] == "paths" else None,
                           action=None if a.flags[0] == "paths" else "append", default=[], help=a.help)
        else:
            p.add_argument(*a.flags, choices=a.choices or None, default=a.default, help=a.help)
    return p


def main(argv: list[str] | None = None) -> int:
    ns = parser().parse_args(argv)
    if ns.rules:
        print(markdown_table())
        return EXIT_CLEAN
    return run(ns.paths, ns.compiled, ns.triton, ns.format)
