"""The CPU route on this machine, in one run: does a row keep its bits (raw torch.mm vs the proven route), what the
route's self-test admitted, what it costs against stock F.linear, and, with --demo, `make demo`'s workload per mode.

    python -m samebits.benchmarks.cpu_route --out DIR [--demo] [--label NAME]

Prints tables, writes DIR/cpu_route.NAME.json and DIR/cpu_route.NAME.png (NAME defaults to the CPU vendor). Times are
wall times with the weights cycled through 8 copies (a model's layers do not fit in cache either), median of 5.
"""
from __future__ import annotations

import argparse
import os
import platform
import random
import statistics
import time

import torch
import torch.nn.functional as F
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

import samebits.kernels as K
from samebits.benchmarks.results import figure, write_json
from samebits.kernels.cpu import gemm, mkl

# (K, N): SmolLM2-135M's linears and lm_head, an 8B-shaped square, and the probe shapes.
PROBE_SHAPES = [(576, 1536), (1000, 1536), (384, 777), (4096, 4096), (1536, 576)]
PROBE_M = [2, 3, 5, 9, 16, 17, 33, 64, 100, 129, 255]
SPEED_SHAPES = [(576, 960), (576, 576), (576, 3072), (1536, 576), (576, 49152), (4096, 4096)]
SPEED_M = [1, 4, 16, 64, 256, 512]
COPIES = 8


def cpu_name() -> str:
    try:
        return next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        return platform.processor() or platform.machine()


def placements_that_differ(fn, k: int, n: int) -> str:
    """A target row at random positions of batches of M other rows vs the row alone (the baseline probe's design)."""
    g = torch.Generator().manual_seed(k * 7 + n)
    w, x = torch.randn(n, k, generator=g) * k ** -0.5, torch.randn(400, k, generator=g)
    rng, bad, tried = random.Random(0), 0, 0
    for target in (0, 57, 399):
        alone = fn(x[target:target + 1], w)
        for m in PROBE_M:
            rows = rng.sample([i for i in range(400) if i != target], m - 1)
            pos = rng.randrange(m)
            rows.insert(pos, target)
            tried += 1
            bad += not torch.equal(fn(x[rows], w)[pos:pos + 1], alone)
    return f"{bad}/{tried}"


def probe() -> dict:
    out = {}
    for k, n in PROBE_SHAPES:
        out[f"K={k},N={n}"] = {"raw torch.mm": placements_that_differ(lambda x, w: x @ w.t(), k, n),
                               "samebits route": placements_that_differ(K.linear, k, n),
                               "verdict": gemm.verdicts().get(f"K={k} N={max(n, gemm.MIN_N)} "
                                                              f"t{gemm.current_threads()}")}
    return out


def _median_ms(fn, reps: int = 5) -> float:
    fn()
    times = []
    for _ in range(reps):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times) * 1e3


def speed(progress: Progress) -> list[dict]:
    rows = []
    task = progress.add_task("speed", total=len(SPEED_SHAPES) * len(SPEED_M))
    for k, n in SPEED_SHAPES:
        copies = 1 if n * k > 1 << 24 else COPIES
        ws = [torch.randn(n, k) * k ** -0.5 for _ in range(copies)]
        gemm.verdict(k, n)  # the proof is load-time work, not timed
        for m in SPEED_M:
            x = torch.randn(m, k)
            stock = _median_ms(lambda x=x, ws=ws: [F.linear(x, w) for w in ws]) / copies
            ours = _median_ms(lambda x=x, ws=ws: [K.linear(x, w) for w in ws]) / copies
            rows.append({"K": k, "N": n, "M": m, "stock_ms": round(stock, 4), "route_ms": round(ours, 4),
                         "ratio": round(ours / stock, 3)})
            progress.advance(task)
    return rows


def demo_workload(progress: Progress) -> dict:
    """As `make demo` runs it: each mode in a fresh process."""
    from samebits.cli import demo

    out = {}
    for mode in ("fast", "deterministic"):
        r, fp = demo._run_in_fresh_process("smollm2-135m", mode, "cpu", progress)
        out[mode] = {"seconds": round(r.seconds, 2), "mkl_cnr": fp["mkl_cnr"],
                     "prompts_with_logprob_bit_diffs": sum(d["logprob_bits"] for d in r.differs())}
    out["ratio"] = round(out["deterministic"]["seconds"] / out["fast"]["seconds"], 3)
    return out


def plot(rows: list[dict], path: str, title: str) -> None:
    with figure(path, figsize=(8, 4)) as (_, ax):
        for k, n in SPEED_SHAPES:
            pts = [r for r in rows if (r["K"], r["N"]) == (k, n)]
            ax.plot([r["M"] for r in pts], [r["ratio"] for r in pts], marker="o", label=f"{n}x{k}")
        ax.axhline(1.0, color="grey", lw=0.8)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("M (rows)")
        ax.set_ylabel("route / stock F.linear (time)")
        ax.set_title(title)
        ax.legend(fontsize=7)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="out")
    ap.add_argument("--demo", action="store_true", help="also time make demo's workload in both modes")
    ap.add_argument("--label", default=None)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    console = Console()
    label = args.label or cpu_name().split()[0].lower()
    report = {"cpu": cpu_name(), "torch": torch.__version__, "threads": torch.get_num_threads(),
              "mkl_cnr": mkl.cnr_mode(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
              "mkl_cbwr_env": os.environ.get("MKL_CBWR"), "known_answer": gemm.known_answer()}
    with Progress(console=console, transient=True) as progress:
        report["probe"] = probe()
        report["speed"] = speed(progress)
        if args.demo:
            report["demo"] = demo_workload(progress)
    report["verdicts"] = gemm.verdicts()
    t = Table(title=f"row alone vs inside M (placements differing), {report['cpu']}, MKL {report['mkl_cnr']}")
    for col in ("shape", "raw torch.mm", "samebits route", "admitted blocks"):
        t.add_column(col)
    for shape, r in report["probe"].items():
        t.add_row(shape, r["raw torch.mm"], r["samebits route"], str(r["verdict"]))
    console.print(t)
    s = Table(title="route vs stock F.linear (ms per call, weights cycled)")
    for col in ("N x K", "M", "stock", "route", "ratio"):
        s.add_column(col)
    for r in report["speed"]:
        s.add_row(f"{r['N']}x{r['K']}", str(r["M"]), f"{r['stock_ms']:.3f}", f"{r['route_ms']:.3f}", f"{r['ratio']:.2f}")
    console.print(s)
    if "demo" in report:
        console.print(f"demo workload: {report['demo']}")
    base = os.path.join(args.out, f"cpu_route.{label}")
    write_json(report, base + ".json", indent=1)
    plot(report["speed"], base + ".png", f"CPU route cost, {report['cpu']} ({report['threads']} threads)")
    console.print(f"wrote {base}.json and {base}.png")


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    main()
