"""A report written as JSON: the one spelling every report of samebits (probe, check, bench, benchmarks) uses."""
from __future__ import annotations

import json
from pathlib import Path


def write_json(report: dict, path: Path, sort_keys: bool = False, indent: int = 2) -> None:
    Path(path).write_text(json.dumps(report, indent=indent, sort_keys=sort_keys) + "\n", encoding="utf-8")
