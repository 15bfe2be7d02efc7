"""The bench report drawn for a terminal: one row per mode, the time by kind of step, and the lines under them, each
fitting 80 columns (tests/cli/test_tables.py). `--json` keeps every number whole."""
from __future__ import annotations

from pathlib import Path

from rich.table import Table

from samebits.jsonfile import write_json

MODE_COLUMNS = ("mode", "tok/s", "TTFT s", "ITL ms", "in step", "roof/step", "alone≠loaded")
STEP_COLUMNS = ("mode", "kind", "steps", "seconds", "mean ms", "tokens", "rows")


def _table(title: str, columns: tuple[str, ...], rows: list[tuple]) -> Table:
    t = Table(title=title)
    for c in columns:
        t.add_column(c, no_wrap=True, overflow="ellipsis")
    for row in rows:
        t.add_row(*row)
    return t


def roofline_cell(share: float | None) -> str:
    return "n/a" if share is None else f"{share:.2f}"


def mode_table(report: dict) -> Table:
    """`in step`: the share of the wall time spent inside engine.step (the rest is the caller's, between steps);
    `roof/step`: achieved / roofline, the workload's ideal lower bound over its wall time, then the same for the
    step-max roofline of the steps the run launched (bench/roofline.py step_roofline)."""
    rows = [(name, f"{s['output_tok_per_s']:.0f}", f"{s['ttft_mean_s']:.2f}", f"{s['itl_mean_ms']:.1f}",
             f"{s['steps']['in_step_s'] / s['seconds']:.0%}",
             f"{roofline_cell(s['of_roofline'])}/{roofline_cell(s.get('of_step_roofline'))}",
             f"{s['alone_vs_loaded_mismatches']}/{s['checked']}") for name, s in report["modes"].items()]
    return _table(f"samebits bench · {report['model']} · {report['device']} · {report['workload']['requests']} "
                  "requests", MODE_COLUMNS, rows)


def steps_table(modes: dict) -> Table:
    """Time inside engine.step by the kind of step launched; tokens and rows are means per step."""
    rows = [(name, kind, str(k["steps"]), f"{k['seconds']:.2f}", f"{k['mean_ms']:.1f}", f"{k['mean_tokens']:.0f}",
             f"{k['mean_rows']:.0f}") for name, s in modes.items() for kind, k in s["steps"]["by_kind"].items()]
    return _table("time inside engine.step, by the kind of step launched", STEP_COLUMNS, rows)


def lines(report: dict) -> list[str]:
    """Wall vs in-step seconds per mode, the roofline (or why there is none) and the deterministic-mode tax."""
    out = [f"{name}: {s['seconds']:.2f} s wall, {s['steps']['in_step_s']:.2f} s in {s['steps']['steps']} steps, "
           f"{s['steps']['between_steps_s']:.2f} s between" for name, s in report["modes"].items()]
    r = report["roofline"]
    if r["total_s"] is None:
        out.append(f"roofline n/a: no measured peaks for {r['device']} {r['dtype']}")
    else:
        out.append(f"roofline {r['total_s']:.2f} s (prefill {r['prefill_s']:.2f}, decode {r['decode_s']:.2f}) at "
                   f"{r['peak_flops'] / 1e12:.0f} TFLOP/s, {r['peak_bytes'] / 1e12:.1f} TB/s")
    out += step_bound_lines(report["modes"])
    if "deterministic_tax" in report:
        out.append(f"deterministic-mode tax {report['deterministic_tax']:.1%} of fast mode's tok/s")
    return out


def step_bound_lines(modes: dict) -> list[str]:
    """Per mode with known peaks: the step-max roofline of its own steps, by kind of step."""
    out = []
    for name, s in modes.items():
        b = s.get("step_roofline")
        if b is not None:
            kinds = ", ".join(f"{k} {v:.1f}" for k, v in sorted(b["by_kind_s"].items()) if v)
            out.append(f"{name}: step-max {b['total_s']:.1f} s ({kinds})")
    return out


def args_json(args) -> dict:
    """A benchmark's argparse values as its report records them: paths as strings, the rest as they are."""
    return {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}


def save_runs(args, runs: list[dict], path: Path, print_table) -> int:
    """A benchmark's end: its arguments and runs to `path` as JSON, its table printed; the exit status."""
    write_json({"args": args_json(args), "runs": runs}, path)
    print_table(runs)
    print(f"wrote {path}")
    return 0
