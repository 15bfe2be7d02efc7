"""Prefill fairness on the device (engine/scheduler/prefills.py): a short request behind a long prompt's prefill.

D requests decode; a P-token prompt arrives and takes its first step; then a 2-token request arrives. Measured per
long-prefill threshold (the default, half the step budget, against 0, the old policy that lets the long prompt take
what the decodes leave): the short request's time to first token in engine steps and ms, against the long prompt's
first step (the issue's bound: within 2 of them); the long prompt's own time to first token (what the cap costs it);
and the mean step time while it prefills (the decoding rows' inter-token latency). Async scheduling as the engine
defaults it (on for CUDA): the long prompt's first step is timed with the device synchronised around it; times to
first token are wall time from the request's add to its output, as a server sees them, with no synchronisation
between steps (under async scheduling a step's output comes back from the next step() call, so the short request's
first token takes 2 calls but about one step's time). On CUDA each mode first runs the workload once untimed
(Triton compiles, CUDA graphs). Writes fairness.json and fairness.png to --out.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import random
import statistics
import time
from pathlib import Path

import torch

from samebits.bench.run import engine_for
from samebits.bench.shapes import random_shape_model
from samebits.benchmarks import e2e, steps
from samebits.benchmarks.results import figure, write_json
from samebits.engine.sampling_params import SamplingParams
from samebits.runtime import deterministic_runtime


def timed_step(engine) -> tuple[float, list]:
    e2e.sync()
    start = time.perf_counter()
    outs = engine.step()
    e2e.sync()
    return 1e3 * (time.perf_counter() - start), outs


def first_output(engine, request_id: str, limit: int = 10_000) -> tuple[int, float, list[float]]:
    """step() calls and wall ms until request_id's first output, and each call's ms (steps overlap as in serving)."""
    times = []
    for _ in range(limit):
        start = time.perf_counter()
        outs = engine.step()
        times.append(1e3 * (time.perf_counter() - start))
        if any(o.request_id == request_id and o.outputs[0].token_ids for o in outs):
            return len(times), sum(times), times
    raise RuntimeError(f"{request_id} got no output in {limit} steps")


def measure(loaded, mode: str, threshold: int | None, args, warm_up: bool = False) -> dict:
    vocab = loaded.config.vocab_size
    with deterministic_runtime() if mode == "deterministic" else contextlib.nullcontext():
        engine = engine_for(loaded, mode, "dynamic", e2e.DEVICE, max_num_batched_tokens=args.budget,
                            long_prefill_token_threshold=threshold)
        try:
            steps.fill(engine, args.decode_rows, args.prompt_len, vocab)
            rng = random.Random(2)
            engine.add_request("long", [rng.randrange(vocab) for _ in range(args.prompt_tokens)],
                               SamplingParams(max_tokens=1))
            first_ms, _ = timed_step(engine)
            engine.add_request("short", [rng.randrange(vocab), rng.randrange(vocab)], SamplingParams(max_tokens=1))
            short_steps, short_ms, _ = first_output(engine, "short")
            _, rest_ms, during = first_output(engine, "long") if "long" in engine.scheduler.requests \
                else (0, 0.0, [])
        finally:
            del engine
            if torch.cuda.is_available():
                torch.cuda.empty_cache()
    row = {"mode": mode, "threshold": "default" if threshold is None else threshold, "long_step_ms": first_ms,
           "short_ttft_steps": short_steps, "short_ttft_ms": short_ms, "short_ttft_long_steps": short_ms / first_ms,
           "long_ttft_ms": first_ms + short_ms + rest_ms,
           "step_ms_while_prefilling": statistics.mean([first_ms, *during])}
    if not warm_up:
        print(json.dumps(row), flush=True)
    return row


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="8b", choices=sorted(e2e.SHAPES))
    ap.add_argument("--modes", default="deterministic,fast")
    ap.add_argument("--budget", type=int, default=2048, help="max_num_batched_tokens (serve's default)")
    ap.add_argument("--prompt-tokens", type=int, default=8000, help="the long prompt")
    ap.add_argument("--decode-rows", type=int, default=32, help="requests decoding beside it")
    ap.add_argument("--prompt-len", type=int, default=256, help="the decoding rows' prompt length")
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke run with --shape tiny")
    args = ap.parse_args(argv)
    e2e.DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    loaded = random_shape_model(args.shape, args.device)
    rows = []
    for mode in args.modes.split(","):
        if args.device == "cuda":  # Triton compiles and graph captures out of the timed rows
            measure(loaded, mode, None, args, warm_up=True)
        rows += [measure(loaded, mode, threshold, args) for threshold in (None, 0)]
    report = {"shape": args.shape, "device": args.device, "args": vars(args) | {"out": str(args.out)}, "rows": rows}
    write_json(report, args.out / "fairness.json")
    print_table(rows)
    plot(rows, args.out / "fairness.png")
    return 0


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="a 2-token request behind a long prompt's prefill")
    for c in ("mode", "threshold", "long step ms", "short TTFT steps", "short TTFT ms", "in long steps",
              "long TTFT ms", "step ms while prefilling"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["mode"], str(r["threshold"]), f"{r['long_step_ms']:.1f}", str(r["short_ttft_steps"]),
                  f"{r['short_ttft_ms']:.1f}", f"{r['short_ttft_long_steps']:.2f}", f"{r['long_ttft_ms']:.1f}",
                  f"{r['step_ms_while_prefilling']:.1f}")
    Console().print(t)


def plot(rows: list[dict], path: Path) -> None:
    with figure(path, figsize=(8, 3.5)) as (_, ax):
        labels = [f"{r['mode'][:3]} thr={r['threshold']}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["short_ttft_ms"] for r in rows], 0.4, label="short request TTFT")
        ax.bar([i + 0.2 for i in x], [2 * r["long_step_ms"] for r in rows], 0.4, label="2 x the long prompt's step")
        ax.set_xticks(list(x), labels, fontsize=8)
        ax.set_ylabel("ms")
        ax.set_yscale("log")
        ax.legend()


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    raise SystemExit(main())
