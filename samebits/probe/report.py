"""The probe report: one JSON document (stable schema) and the rich table drawn from it."""
from __future__ import annotations

from pathlib import Path

from rich.markup import escape
from rich.table import Table

from samebits import jsonfile
from samebits.probe.probes import ProbeResult

SCHEMA_VERSION = 1
TABLE_COLUMNS = 80
VERDICTS = ("invariant", "variant", "n/a", "error")


def build_report(device: str, fingerprint: dict, results: list[ProbeResult], full: bool, elapsed_s: float) -> dict:
    return {"schema": SCHEMA_VERSION, "device": device, "full": full, "elapsed_s": round(elapsed_s, 3),
            "fingerprint": fingerprint, "probes": [r.as_dict() for r in results]}


def write_json(report: dict, path: Path) -> None:
    jsonfile.write_json(report, path, sort_keys=True)  # the probe schema's files keep their keys sorted


# Short dtype names, so a row fits 80 columns (the JSON keeps torch's names).
_DTYPES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "float64": "fp64"}


def _counted(r: dict) -> str:
    varied = sum(f > 0 for f in r["mismatch_fraction"])
    if r["axis"] == "runs":
        return f"{r['extra'].get('runs_differing', varied)}/{r['sizes'][0] - 1} reruns"
    if r["axis"] == "order":
        return ""
    if r["axis"] == "prompts":
        return f"{r['extra']['sequences_differ']}/{r['extra']['sequences']} seqs"
    return f"{varied}/{len(r['sizes'])} sizes"


def _detail(r: dict) -> str:
    """A variant cell's second line: how far apart the answers are (Δ: the largest absolute difference)."""
    diff = f"Δ≤{max(r['max_abs_diff']):.1e}"
    if r["axis"] == "order":
        return f"(a+b)+c={r['extra']['left']:g}, a+(b+c)={r['extra']['right']:g}"
    if r["axis"] == "prompts":
        e = r["extra"]
        return f"{e['logit_rows_differ']}/{e['logit_rows_compared']} rows, {diff}"
    return f"≤{max(r['mismatch_fraction']):.1%}, {diff}"


def cell(r: dict | None) -> str:
    """Two lines at most: the verdict with its count, then the size of the difference or why there is none."""
    if r is None:
        return ""
    if r["verdict"] == "n/a":
        return f"[dim]n/a\n{escape(r['note'])}[/]"
    if r["verdict"] == "error":
        return f"[bold magenta]ERROR[/]\n{escape(r['note'])}"
    if r["verdict"] == "invariant":
        return f"[green]invariant[/] {_counted(r)}"
    return f"[bold red]VARIANT[/] {_counted(r)}".rstrip() + f"\n{_detail(r)}"


def table(report: dict) -> Table:
    """One row per probe and dtype, fitting 80 columns: long notes are cut (the JSON report keeps them whole)."""
    t = Table(title=f"samebits probe · {report['device']}" + (" · full" if report["full"] else ""))
    longest = max((len(r["name"]) for r in report["probes"]), default=0)
    t.add_column("probe · dtype · compared", no_wrap=True, min_width=longest)
    for col in ("vendor", "samebits"):  # what the names leave of 80 columns (10 are borders and padding)
        t.add_column(col, no_wrap=True, overflow="ellipsis", max_width=max(12, (TABLE_COLUMNS - 10 - longest) // 2))
    rows: dict[tuple, dict] = {}
    for r in report["probes"]:
        rows.setdefault((r["name"], r["dtype"]), {})[r["implementation"]] = r
    for (name, dtype), by_impl in rows.items():
        what = " · ".join(filter(None, (_DTYPES.get(dtype, dtype), _compared(by_impl))))
        t.add_row(f"{name}\n[dim]{what}[/]", cell(by_impl.get("vendor")), cell(by_impl.get("samebits")))
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
