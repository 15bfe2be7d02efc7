"""Where a decode step's time goes (GPU): wall time per step vs GPU-busy time, per batch size and mode.

Host exposure = 1 - busy / wall: the share of a step the GPU waits for Python. Decode steps of an 8B-shaped random
model after a 512-token prefill, CUDA graphs on. Writes steps.json and steps.png to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import time
from pathlib import Path

import torch

from samebits.bench.shapes import random_shape_model
from samebits.benchmarks import e2e
from samebits.benchmarks.results import figure, write_json
from samebits.engine.sampling_params import SamplingParams
from samebits.runtime import deterministic_runtime


def fill(engine, batch: int, prompt_len: int, vocab: int) -> None:
    """`batch` requests past their prefill, so every later step is a pure decode step of `batch` rows."""
    rng = random.Random(batch)
    for i in range(batch):
        engine.add_request(f"{batch}-{i}", [rng.randrange(vocab) for _ in range(prompt_len)],
                           SamplingParams(temperature=0.8, seed=i, max_tokens=2048, ignore_eos=True))
    started: set[str] = set()
    while len(started) < batch:
        started.update(o.request_id for o in engine.step() if o.outputs[0].token_ids)
    for _ in range(3):
        engine.step()


def wall_ms(engine, steps: int) -> float:
    e2e.sync()
    t = time.perf_counter()
    for _ in range(steps):
        engine.step()
    e2e.sync()
    return 1e3 * (time.perf_counter() - t) / steps


def host_hotspots(engine, steps: int, top: int = 15) -> tuple[list, list]:
    """The host functions a step spends its own time in (cProfile tottime, ms per step), and samebits' functions by
    cumulative time (which phase of the step holds that time): where the GPU waits."""
    import cProfile
    import pstats

    prof = cProfile.Profile()
    prof.enable()
    for _ in range(steps):
        engine.step()
    e2e.sync()
    prof.disable()
    stats = pstats.Stats(prof).stats
    own = sorted(((f"{Path(f).name}:{line}({fn})", v[2] / steps * 1e3) for (f, line, fn), v in stats.items()),
                 key=lambda x: -x[1])
    cum = sorted(((f"{Path(f).parent.name}/{Path(f).name}:{line}({fn})", v[3] / steps * 1e3)
                  for (f, line, fn), v in stats.items() if "samebits" in f), key=lambda x: -x[1])
    return own[:top], cum[:2 * top]


def busy_ms(engine, steps: int) -> tuple[float, list, list]:
    """GPU time per step, the kernels' own time summed (the profiler's self device time), the top kernels, and the
    host ops by their own CPU time (ms per step; a Triton launch shows as its kernel's name)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    cuda = e2e.DEVICE == "cuda"
    with profile(activities=[ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if cuda else [])) as prof:
        for _ in range(steps):
            engine.step()
        e2e.sync()
    events = prof.key_averages()
    # Kernels only: a CPU op's self device time is its kernels' time again, and would count it twice.
    kernels = [e for e in events if not cuda or e.device_type == DeviceType.CUDA]
    own = [(e.key[:60], (e.self_device_time_total if cuda else e.self_cpu_time_total) / steps / 1e3) for e in kernels]
    total = sum(ms for _, ms in own)
    top = sorted(own, key=lambda x: -x[1])[:16]
    host = sorted(((e.key[:60], e.self_cpu_time_total / steps / 1e3, e.count // steps) for e in events),
                  key=lambda x: -x[1])[:20]
    return total, top, host


def measure(loaded, mode: str, overlap: bool, grid: str, batches, prompt_len: int, steps: int) -> list[dict]:
    """grid "full": decode graphs sized for max_model_len's splits whatever the contexts, as before graphs per grid
    length (engine/cuda_graphs.py grid_len); "tight": the engine's own."""
    rows = []
    with deterministic_runtime() if mode == "deterministic" else contextlib.nullcontext():
        engine = e2e.make_engine(loaded, mode, "dynamic", async_scheduling=overlap)
        graphs = engine.runner.graphs
        if grid == "full" and graphs is not None:
            graphs.grid_len = lambda longest: graphs.max_model_len
        for batch in batches:
            fill(engine, batch, prompt_len, loaded.config.vocab_size)
            wall = wall_ms(engine, steps)
            busy, top, host_ops = busy_ms(engine, min(steps, 8))
            own, cum = host_hotspots(engine, min(steps, 8))
            rows.append({"mode": mode, "async_scheduling": overlap, "grid": grid, "batch": batch, "wall_ms": wall,
                         "gpu_busy_ms": busy,
                         "host_exposed": 1 - busy / wall, "top_kernels_ms": top,
                         "host_ops_ms_calls": host_ops, "host_tottime_ms": own,
                         "host_cumtime_ms": cum})
            print(json.dumps(rows[-1]), flush=True)
            for i in range(batch):
                engine.abort_request(f"{batch}-{i}")
        del engine
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="8b", choices=sorted(e2e.SHAPES))
    ap.add_argument("--batches", default="1,64,256")
    ap.add_argument("--prompt-len", type=int, default=512)
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke run with --shape tiny")
    ap.add_argument("--quantization", default=None, choices=("fp8", "fp8_per_tensor"),
                    help="the model's linears in FP8, as --quantization does at load (models/quantization.py)")
    args = ap.parse_args()
    e2e.DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    loaded = random_shape_model(args.shape, args.device, args.quantization)
    batches = [int(b) for b in args.batches.split(",")]
    # Async scheduling off and on, and graph grids tight and full, side by side: what each buys, in one run.
    runs = [("deterministic", False, "tight"), ("deterministic", True, "tight"), ("deterministic", True, "full"),
            ("fast", True, "tight")]
    if args.quantization == "fp8_per_tensor":  # refused in deterministic mode
        runs = [run for run in runs if run[0] == "fast"]
    rows = [r for mode, overlap, grid in runs
            for r in measure(loaded, mode, overlap, grid, batches, args.prompt_len, args.steps)]
    write_json({"shape": args.shape, "quantization": args.quantization, "rows": rows}, args.out / "steps.json")
    print_table(rows)
    plot(rows, args.out / "steps.png")


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="decode step: wall vs GPU busy")
    for c in ("mode", "async", "graph grid", "batch", "wall ms", "GPU busy ms", "host exposed", "top kernel"):
        t.add_column(c)
    for r in rows:
        name, ms = r["top_kernels_ms"][0] if r["top_kernels_ms"] else ("-", 0.0)
        t.add_row(r["mode"], "on" if r["async_scheduling"] else "off", r["grid"], str(r["batch"]), f"{r['wall_ms']:.2f}",
                  f"{r['gpu_busy_ms']:.2f}", f"{r['host_exposed']:.0%}", f"{name[:40]} {ms:.2f}")
    Console().print(t)


def plot(rows: list[dict], path: Path) -> None:
    with figure(path, figsize=(9, 3.5)) as (_, ax):
        labels = [f"{r['mode'][:3]}{'+a' if r['async_scheduling'] else ''}{'+full' if r['grid'] == 'full' else ''} "
                  f"b{r['batch']}" for r in rows]
        ax.bar(labels, [r["wall_ms"] for r in rows], label="wall")
        ax.bar(labels, [r["gpu_busy_ms"] for r in rows], label="GPU busy")
        ax.set_ylabel("ms per decode step")
        ax.legend()


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    main()
