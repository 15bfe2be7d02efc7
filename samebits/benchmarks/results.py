"""What every benchmark leaves under its --out folder: the JSON report, written by the one writer of samebits'
reports (jsonfile.py), and the PNG, drawn off-screen with one set of figure settings."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

from samebits.jsonfile import write_json

__all__ = ["figure", "write_json"]


@contextlib.contextmanager
def figure(path: Path | str, *grid: int, **subplots) -> Iterator[tuple]:
    """Yields `plt.subplots(*grid, **subplots)`'s (figure, axes); on a clean exit lays the figure out and writes it to
    path as a PNG. The figure is closed either way, so a long sweep that plots after each case holds none open."""
    import matplotlib

    matplotlib.use("Agg")  # no display on the device machines or in CI
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(*grid, **subplots)
    try:
        yield fig, axes
        fig.tight_layout()
        fig.savefig(path, dpi=120)
    finally:
        plt.close(fig)
