"""`samebits` command line: `main` holds the typer app and its commands, `demo` the demo and generate commands."""
from samebits.cli.main import app, main

__all__ = ["app", "main"]
