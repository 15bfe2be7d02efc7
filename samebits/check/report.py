"""The report: one JSON document (stable schema), the verdict and exit code drawn from it, and its rich table."""
from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

from rich.markup import escape
from rich.table import Table

from samebits import __version__
from samebits.check.config import CheckConfig
from samebits.check.experiment import Outcome, Request
from samebits.check.sample import Sample

SCHEMA_VERSION = 1
EXIT = {"clean": 0, "variant": 1, "could not test": 2}


def verdict(outcomes: list[Outcome]) -> str:
    statuses = {o.status for o in outcomes}
    if "variant" in statuses:
        return "variant"
    if statuses & {"error", "incomplete"} or statuses <= {"skipped"}:
        return "could not test"
    return "clean"


def _config(cfg: CheckConfig) -> dict:
    values = asdict(cfg)
    values["api_key"] = "***" if cfg.api_key else None  # a report is shared; the key is not
    return values


def build(cfg: CheckConfig, model: str, endpoint: dict, outcomes: list[Outcome],
          references: dict[str, tuple[Request, Sample]], requests: int, elapsed_s: float,
          compared_to: str | None) -> dict:
    v = verdict(outcomes)
    return {
        "schema": SCHEMA_VERSION, "tool": f"samebits check {__version__}", "url": cfg.url, "model": model,
        "api": cfg.api, "verdict": v, "exit_code": EXIT[v],
        "comparison": {"tolerance": cfg.tolerance,
                       "exact": cfg.tolerance == 0,
                       "what": "token ids (or token strings) and logprob values as sent"},
        "endpoint": endpoint, "requests": requests, "elapsed_s": round(elapsed_s, 3), "compared_to": compared_to,
        "config": _config(cfg), "experiments": [o.as_dict() for o in outcomes],
        "references": [{"name": n, "path": r.path, "body": r.body, "sample": s.as_dict()}
                       for n, (r, s) in references.items()],
    }


def load(path: Path) -> dict:
    """An earlier report for --compare; ValueError with the one-line reason when it is not one."""
    try:
        report = json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ValueError(f"cannot read report {path}: {e}") from None
    if not isinstance(report, dict) or report.get("schema") != SCHEMA_VERSION or "references" not in report:
        raise ValueError(f"{path} is not a samebits check report (schema {SCHEMA_VERSION})")
    return report


STYLE = {"clean": "green", "variant": "bold red", "skipped": "dim", "incomplete": "yellow", "error": "magenta",
         "could not test": "magenta"}


def _delta(value: float) -> str:
    return "0" if value == 0 else f"{value:.3e}"


def rows(report: dict) -> list[list[str]]:
    """Plain cells, one row per compared group (or one per experiment without groups); HTML uses them too."""
    out = []
    for e in report["experiments"]:
        head = [e["name"], e["status"], e["method"] or ""]
        if not e["groups"]:
            out.append(head + ["", "", "", "", "", e["note"]])
        for i, g in enumerate(e["groups"]):
            first = "" if g["first_divergence"] is None else str(g["first_divergence"])
            out.append((head if i == 0 else ["", "", ""]) + [
                g["label"], f"{g['diverged']}/{g['observations']}", str(g["unique_outputs"]), first,
                _delta(g["max_abs_delta"]), e["note"] if i == 0 else ""])
    return out


COLUMNS = ("experiment", "status", "method", "compared", "diverged", "unique outputs", "first diverging position",
           "max |Δlogprob|", "note")


# The terminal table's columns, 80 wide: the HTML report has every column of COLUMNS; here method and note move to
# the caption, the status under the experiment's name.
TERMINAL_COLUMNS = ("experiment", "compared", "diverged", "uniq", "first", "max |Δ|")


def table(report: dict) -> Table:
    tol = "exact" if report["comparison"]["exact"] else f"tolerance {report['comparison']['tolerance']:g} (explicit)"
    t = Table(title=f"samebits check · {report['url']} · {report['model']} · {report['api']} · {tol}",
              caption_justify="left")
    for c in TERMINAL_COLUMNS:
        t.add_column(c, no_wrap=True, overflow="ellipsis")
    for e in report["experiments"]:
        groups = [[g["label"], f"{g['diverged']}/{g['observations']}", str(g["unique_outputs"]),
                   "" if g["first_divergence"] is None else str(g["first_divergence"]),
                   "0" if g["max_abs_delta"] == 0 else f"{g['max_abs_delta']:.1e}"]
                  for g in e["groups"]] or [[""] * 5]
        heads = _heads(escape(e["name"]), f"[{STYLE[e['status']]}]{e['status']}[/]", len(groups))
        for i, (head, cells) in enumerate(zip(heads, groups)):
            t.add_row(head, *(escape(c) for c in cells), end_section=i == len(groups) - 1)
    v = report["verdict"]
    summary = (f"[{STYLE[v]}]{v.upper()}[/] · {report['requests']} requests in {report['elapsed_s']:.1f}s · "
               f"system_fingerprint {escape(', '.join(report['endpoint']['system_fingerprints']) or 'absent')}")
    lines = [summary, "uniq: unique outputs · first: first diverging position · max |Δ|: largest |Δlogprob|"]
    lines += [escape(f"{e['name']}: " + "; ".join(filter(None, (e["method"] and f"by {e['method']}", e["note"]))))
              for e in report["experiments"] if e["method"] or e["note"]]
    t.caption = "\n".join(lines)
    return t


def _heads(name: str, status: str, n: int) -> list[str]:
    """The experiment column down its group rows: the name, then the status (on the name's row when it has one)."""
    return [f"{name}\n{status}"] if n == 1 else [name, status] + [""] * (n - 2)