"""PNG of mismatch fraction vs batch size: one line per batch-sweep probe and implementation."""
from __future__ import annotations

from pathlib import Path


def write_plot(report: dict, path: Path) -> int:
    """Draws every measured batch-axis result; returns how many lines were drawn."""
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5.5))
    lines = [r for r in report["probes"] if r["axis"] == "batch" and r["sizes"]]
    for r in lines:
        style = "-" if r["implementation"] == "vendor" else "--"
        ax.plot(r["sizes"], r["mismatch_fraction"], style, marker="o", markersize=3,
                label=f"{r['name']} {r['dtype']} [{r['implementation']}]")
    _decorate(ax, report)
    fig.tight_layout()
    fig.savefig(path, dpi=120, format="png")
    plt.close(fig)
    return len(lines)


def _decorate(ax, report: dict) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("batch size (rows / sequences computed together)")
    ax.set_ylabel("fraction of row 0's elements whose bits differ from batch size 1")
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(f"batch variance · {report['device']}")
    ax.grid(True, alpha=0.3)
    if ax.lines:
        ax.legend(fontsize=7, loc="best")
