"""A report written as JSON: the one spelling every report of samebits (probe, check, bench, benchmarks) uses, and
the check that its path can be written, made before the minutes of work that fill it."""
from __future__ import annotations

import json
import os
from pathlib import Path


def write_json(report: dict, path: Path, sort_keys: bool = False, indent: int = 2) -> None:
    Path(path).write_text(json.dumps(report, indent=indent, sort_keys=sort_keys) + "\n", encoding="utf-8")


def check_writable(path: Path | None) -> None:
    """Fail before the minutes of work (probes, requests, a workload), not after: ValueError when `path` cannot be
    written."""
    if path is None:
        return
    parent = path.parent if str(path.parent) else Path(".")
    if path.is_dir():
        raise ValueError(f"cannot write {path}: it is a directory")
    if not parent.is_dir():
        raise ValueError(f"cannot write {path}: no directory {parent}")
    if not os.access(parent, os.W_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise ValueError(f"cannot write {path}: permission denied")
