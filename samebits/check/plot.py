"""Divergence vs concurrency as inline SVG: the fraction of needles that diverged and their max |Δlogprob|."""
from __future__ import annotations

import io


def svg(report: dict) -> str | None:
    """None when no experiment swept concurrency."""
    series = {e["name"]: [g for g in e["groups"] if g["level"] is not None] for e in report["experiments"]}
    series = {k: v for k, v in series.items() if v}
    if not series:
        return None
    import matplotlib

    matplotlib.use("Agg")  # no display on servers and CI
    import matplotlib.pyplot as plt

    fig, (frac, delta) = plt.subplots(1, 2, figsize=(10, 4))
    for name, groups in series.items():
        levels = [g["level"] for g in groups]
        frac.plot(levels, [g["diverged"] / g["observations"] for g in groups], marker="o", label=name)
        delta.plot(levels, [g["max_abs_delta"] for g in groups], marker="o", label=name)
    _axes(frac, "fraction of needles that diverged", linear=True)
    _axes(delta, "max |Δlogprob| vs the solo answer", linear=False)
    fig.suptitle(f"{report['url']} · {report['model']} · {report['verdict']}")
    fig.tight_layout()
    out = io.StringIO()
    fig.savefig(out, format="svg")
    plt.close(fig)
    text = out.getvalue()
    return text[text.index("<svg"):]  # drop the XML prolog and doctype: the page inlines the element


def _axes(ax, ylabel: str, linear: bool) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xlabel("requests in flight (burst size)")
    ax.set_ylabel(ylabel)
    if linear:
        ax.set_ylim(-0.05, 1.05)
    else:
        ax.set_yscale("symlog", linthresh=1e-8)  # 0 (bit-identical) stays on the axis
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
