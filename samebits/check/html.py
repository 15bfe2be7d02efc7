"""A self-contained HTML page: verdict, endpoint, the table, the inline SVG plot and the JSON itself."""
from __future__ import annotations

import html
import json
from pathlib import Path

from samebits.check.plot import svg
from samebits.check.report import COLUMNS, rows

CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:80em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left;vertical-align:top}th{background:#f4f4f4}
.clean{color:#197a19}.variant{color:#b00;font-weight:bold}.skipped{color:#777}.incomplete{color:#a60}
.error,.could{color:#909}pre{background:#f8f8f8;padding:1em;overflow:auto;max-height:30em}"""


def _table(report: dict) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = []
    for r in rows(report):
        cells = [f"<td>{html.escape(c)}</td>" for c in r]
        cells[1] = f'<td class="{html.escape(r[1].split()[0]) if r[1] else ""}">{html.escape(r[1])}</td>'
        body.append("<tr>" + "".join(cells) + "</tr>")
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _endpoint(report: dict) -> str:
    ep = report["endpoint"]
    items = [("system_fingerprint", ", ".join(f"{k} ({n})" for k, n in ep["system_fingerprints"].items())
              or "absent")]
    items += [(k, ", ".join(f"{v} ({n})" for v, n in vals.items())) for k, vals in ep["headers"].items()]
    return "<ul>" + "".join(f"<li><code>{html.escape(k)}</code>: {html.escape(v)}</li>" for k, v in items) + "</ul>"


def page(report: dict) -> str:
    v = report["verdict"]
    cmp = report["comparison"]
    how = "exact (no tolerance)" if cmp["exact"] else f"with an explicit tolerance of {cmp['tolerance']:g}"
    plot = svg(report) or "<p>No experiment swept concurrency.</p>"
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>samebits check: {html.escape(v)}</title>
<style>{CSS}</style></head><body>
<h1>samebits check: <span class="{html.escape(v.split()[0])}">{html.escape(v)}</span></h1>
<p>{html.escape(report['url'])} · model <code>{html.escape(report['model'])}</code> · {html.escape(report['api'])} API ·
{report['requests']} requests in {report['elapsed_s']:.1f}s · comparison {html.escape(how)} ·
{html.escape(report['tool'])}</p>
<h2>Endpoint</h2>{_endpoint(report)}
<h2>Experiments</h2>{_table(report)}
<h2>Divergence vs concurrency</h2>{plot}
<details><summary>report JSON</summary><pre>{html.escape(json.dumps(report, indent=2))}</pre></details>
</body></html>
"""


def write_html(report: dict, path: Path) -> None:
    Path(path).write_text(page(report), encoding="utf-8")
