"""`samebits` command line: one console script, subcommands. Heavy imports stay inside the commands."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

app = typer.Typer(add_completion=False, no_args_is_help=True, help="samebits: same request, same bits.")
console = Console()


def fail(message: str, code: int = 2) -> None:
    """One-line error and a non-zero exit; never a traceback for the user's mistake."""
    Console(stderr=True).print(f"[bold red]error:[/] {message}")
    raise typer.Exit(code)


def _print_json_or_table(data: dict, title: str, as_json: bool) -> None:
    if as_json:
        print(json.dumps(data, indent=2, sort_keys=True))
        return
    table = Table(title=title)
    table.add_column("field")
    table.add_column("value")
    for k, v in data.items():
        table.add_row(k, json.dumps(v) if isinstance(v, (dict, list)) else str(v))
    console.print(table)


@app.command()
def env(
    shell: bool = typer.Option(False, "--shell", help="Print the deployment template as shell exports."),
    check: bool = typer.Option(False, "--check", help="Check this environment; exit 1 with a table of problems."),
):
    """The deterministic deployment template (environment half)."""
    from samebits.runtime import env_problems, shell_exports

    if shell or not check:
        print(shell_exports())
        return
    problems = env_problems()
    if not problems:
        console.print("[green]environment matches the deterministic template[/]")
        return
    table = Table(title="environment problems")
    for col in ("variable", "expected", "actual"):
        table.add_column(col)
    for p in problems:
        table.add_row(p.item, p.expected, p.actual)
    console.print(table)
    console.print('fix: eval "$(samebits env --shell)"')
    raise typer.Exit(1)


@app.command("fingerprint")
def fingerprint_cmd(
    as_json: bool = typer.Option(False, "--json", help="Print JSON."),
    mode: str = typer.Option("deterministic", help="fast or deterministic"),
):
    """Every version and setting that can change output bits, and their hash."""
    from samebits.runtime import fingerprint

    _print_json_or_table(fingerprint(mode), "samebits fingerprint", as_json)


@app.command()
def lock(path: Path = typer.Argument(Path("samebits.lock")), mode: str = "deterministic"):
    """Write the fingerprint to a lock file."""
    from samebits.runtime import write_lock

    try:
        fp = write_lock(path, mode)
    except OSError as e:
        fail(f"cannot write {path}: {e.strerror}")
    console.print(f"wrote {path} (hash {fp['hash']})")


@app.command("verify-lock")
def verify_lock_cmd(path: Path = typer.Argument(Path("samebits.lock"))):
    """Compare this machine with a lock file; exit 1 on drift, field by field."""
    from samebits.runtime import verify_lock

    if not path.is_file():
        fail(f"no lock file at {path}; write one with `samebits lock {path}`")
    drift = verify_lock(path)
    if not drift:
        console.print("[green]no drift[/]")
        return
    table = Table(title=f"drift against {path}")
    for col in ("field", "locked", "now"):
        table.add_column(col)
    for field, old, new in drift:
        table.add_row(field, json.dumps(old), json.dumps(new))
    console.print(table)
    raise typer.Exit(1)


@app.command()
def probe(
    device: str = typer.Option("cpu", help="cpu or cuda"),
    full: bool = typer.Option(False, "--full", help="The seed's sizes (meant for a GPU)."),
    json_path: Optional[Path] = typer.Option(None, "--json", help="Write the report as JSON."),
    plot_path: Optional[Path] = typer.Option(None, "--plot", help="Write a PNG: mismatch vs batch size."),
    only: Optional[str] = typer.Option(None, help="Comma-separated probe names."),
):
    """Reproduce the problem: the seed's experiments, vendor vs samebits."""
    from samebits.diagnostics.cli import probe_command

    probe_command(device=device, full=full, json_path=json_path, plot_path=plot_path, only=only, fail=fail)


@app.command()
def models():
    """List cached models."""
    from samebits.models.hub import list_cached

    table = Table(title="cached models")
    for col in ("name", "path", "size"):
        table.add_column(col)
    for name, path, size in list_cached():
        table.add_row(name, str(path), f"{size / 1e6:.1f} MB")
    console.print(table)


@app.command()
def demo(
    model: str = typer.Option("smollm2-135m"),
    device: Optional[str] = typer.Option(None),
    json_path: Optional[Path] = typer.Option(None, "--json"),
):
    """The main job: 16 prompts alone vs in a busy batch, fast vs deterministic mode."""
    from samebits.engine.demo import demo_command

    demo_command(model=model, device=device, json_path=json_path, fail=fail)


@app.command()
def generate(
    prompt: list[str] = typer.Argument(..., help="One or more prompts."),
    model: str = typer.Option("smollm2-135m"),
    mode: str = typer.Option("deterministic"),
    max_tokens: int = typer.Option(32),
    temperature: float = typer.Option(0.0),
    seed: Optional[int] = typer.Option(None),
    chat: bool = typer.Option(True, help="Apply the model's chat template."),
    device: Optional[str] = typer.Option(None),
):
    """Generate for one-off prompts."""
    from samebits.engine.demo import generate_command

    generate_command(prompt, model=model, mode=mode, max_tokens=max_tokens, temperature=temperature, seed=seed,
                     chat=chat, device=device, fail=fail)


def main() -> None:
    try:
        app()
    except KeyboardInterrupt:
        sys.exit(130)


if __name__ == "__main__":
    main()
