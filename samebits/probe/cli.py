"""`samebits probe`: argument checks, the progress bar, and the three outputs (table, JSON, PNG)."""
from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from samebits.jsonfile import check_writable
from samebits.progress import progress_bar


def run_with_progress(dev, sizes, probes, impls) -> list:
    from samebits.probe.probes import iter_probes

    results = []
    with progress_bar() as bar:
        task = bar.add_task("probing", total=len(probes) * len(impls))
        for label, rs in iter_probes(dev, sizes, probes, impls):
            results.extend(rs)
            bar.update(task, advance=1, description=label)
    return results


def _checked_inputs(device: str, only: str | None, paths: list) -> tuple:
    from samebits.models.loader import resolve_device
    from samebits.probe.probes import PROBES, select

    dev = resolve_device(device)
    try:
        probes = select(only)
    except KeyError as e:
        raise ValueError(f"unknown probe {e.args[0]!r}; known: {', '.join(PROBES)}") from None
    for p in paths:
        check_writable(p)
    return dev, probes


def _write_outputs(report: dict, json_path: Path | None, plot_path: Path | None) -> None:
    from samebits.probe.plot import write_plot
    from samebits.probe.report import write_json

    if json_path is not None:
        write_json(report, json_path)
    if plot_path is not None:
        write_plot(report, plot_path)


def probe_command(device: str, full: bool, json_path: Path | None, plot_path: Path | None, only: str | None,
                  fail: Callable[[str], None]) -> dict:
    from samebits.probe.impls import all_impls
    from samebits.probe.probes import DEFAULT, FULL
    from samebits.probe.report import build_report, errors, table
    from samebits.runtime import fingerprint

    try:
        dev, probes = _checked_inputs(device, only, [json_path, plot_path])
    except ValueError as e:
        fail(str(e))
    start = time.perf_counter()
    results = run_with_progress(dev, FULL if full else DEFAULT, probes, all_impls(dev))
    report = build_report(str(dev), fingerprint(), results, full, time.perf_counter() - start)
    Console().print(table(report))
    try:
        _write_outputs(report, json_path, plot_path)
    except OSError as e:
        fail(f"cannot write output: {e.strerror or e}")
    if errors(report):
        fail(f"{len(errors(report))} probe cell(s) raised instead of measuring; see the ERROR cells above", 1)
    return report
