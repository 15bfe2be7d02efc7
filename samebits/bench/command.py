"""`samebits bench`: flags checked before anything loads, the model loaded (its own bar), every mode under the one
progress bar, then the tables and the JSON report."""
from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

from rich.console import Console

from samebits.bench.config import BenchConfig


def _checked(values: dict, json_path: Path | None) -> tuple[BenchConfig, str]:
    from samebits.jsonfile import check_writable
    from samebits.models.loader import default_device, resolve_device

    config = BenchConfig.from_dict(values)
    device = config.device or default_device()
    resolve_device(device)
    check_writable(json_path)
    return config, device


def bench_command(values: dict, json_path: Path | None, fail: Callable[[str], None]) -> dict:
    from samebits.bench.report import lines, mode_table, steps_table
    from samebits.bench.run import bench_workload, load, run_bench
    from samebits.jsonfile import write_json
    from samebits.progress import progress_bar
    from samebits.runtime import runtime_for

    try:
        config, device = _checked(values, json_path)
        with runtime_for(config.modes[0]):
            loaded = load(config, device)
        work = bench_workload(config, loaded.config)
    except (FileNotFoundError, ValueError, RuntimeError) as e:  # flags, model, its context: one line, no traceback
        fail(str(e))
    with progress_bar() as bar:
        report = run_bench(config, loaded, work, device, bar)
    console = Console()
    console.print(mode_table(report))
    console.print(steps_table(report["modes"]))
    for line in lines(report):
        console.print(line, highlight=False)
    if json_path is not None:
        try:
            write_json(report, json_path)
        except OSError as e:
            fail(f"cannot write {json_path}: {e.strerror}")
    return report
