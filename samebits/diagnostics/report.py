"""The probe report: one JSON document (stable schema) and the rich table drawn from it."""
from __future__ import annotations

import json
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from samebits.diagnostics.probes import ProbeResult

SCHEMA_VERSION = 1
VERDICTS = ("invariant", "variant", "n/a", "error")


def build_report(device: str, fingerprint: dict, results: list[ProbeResult], full: bool, elapsed_s: float) -> dict:
    return {"schema": SCHEMA_VERSION, "device": device, "full": full, "elapsed_s": round(elapsed_s, 3),
            "fingerprint": fingerprint, "probes": [r.as_dict() for r in results]}


def write_json(report: dict, path: Path) -> None:
    Path(path).write_text(json.dumps(report, indent=2, sort_keys=True) + "\n")


def _counted(r: dict) -> str:
    varied = sum(f > 0 for f in r["mismatch_fraction"])
    if r["axis"] == "runs":
        return f"{r['extra'].get('runs_differing', varied)}/{r['sizes'][0] - 1} reruns"
    if r["axis"] == "order":
        return f"(a+b)+c = {r['extra']['left']:g}, a+(b+c) = {r['extra']['right']:g}"
    if r["axis"] == "prompts":
        e = r["extra"]
        return f"{e['sequences_differ']}/{e['sequences']} seqs, {e['logit_rows_differ']}/{e['logit_rows_compared']} logit rows"
    return f"{varied}/{len(r['sizes'])} sizes"


def cell(r: dict | None) -> str:
    if r is None:
        return ""
    if r["verdict"] == "n/a":
        return f"[dim]n/a ({escape(r['note'])})[/]"
    if r["verdict"] == "error":
        return f"[bold magenta]ERROR[/] {escape(r['note'])}"
    if r["verdict"] == "invariant":
        return f"[green]invariant[/] {_counted(r)}"
    if r["axis"] in ("order", "prompts"):
        return f"[bold red]VARIANT[/] {_counted(r)}, |Δ|≤{max(r['max_abs_diff']):.1e}"
    worst, diff = max(r["mismatch_fraction"]), max(r["max_abs_diff"])
    return f"[bold red]VARIANT[/] {_counted(r)}, ≤{worst:.1%} of elements, |Δ|≤{diff:.1e}"


def table(report: dict) -> Table:
    t = Table(title=f"samebits probe · {report['device']}" + (" · full" if report["full"] else ""))
    t.add_column("probe", no_wrap=True)
    for col in ("dtype", "compared", "vendor", "samebits"):
        t.add_column(col)
    rows: dict[tuple, dict] = {}
    for r in report["probes"]:
        rows.setdefault((r["name"], r["dtype"]), {})[r["implementation"]] = r
    for (name, dtype), by_impl in rows.items():
        t.add_row(name, dtype, _compared(by_impl), cell(by_impl.get("vendor")), cell(by_impl.get("samebits")))
    return t


def _compared(by_impl: dict) -> str:
    measured = [r for r in by_impl.values() if r["sizes"]]
    if not measured:
        return ""
    r = measured[0]
    return f"{r['axis']} {_span(r['sizes'])}"


def _span(sizes: list) -> str:
    return str(sizes[0]) if len(sizes) == 1 else f"{sizes[0]}…{sizes[-1]}"


def errors(report: dict) -> list[dict]:
    return [r for r in report["probes"] if r["verdict"] == "error"]
