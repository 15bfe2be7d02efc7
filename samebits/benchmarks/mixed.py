"""A mixed prefill+decode step against the sum of its parts (the target of docs/BENCHMARKS.md §8: not slower than the
sum). For D decoding rows and one P-token prompt: one step decoding the D rows alone, one step prefilling the P tokens
alone, and one step doing both; ratio = mixed / (decode + prefill).

Async scheduling is off, so a step's call holds that step's own work, and the device is synchronised around it. Each
time is the median of --repeat steps after one untimed step of each kind (compiles, graph captures); every timed
step's kind is checked against what the scheduler launched. Decode-only steps replay CUDA graphs, mixed steps run
eagerly: the ratio is what that costs. Writes mixed.json and mixed.png to --out.
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

from samebits.bench.shapes import random_shape_model
from samebits.bench.steplog import StepLog
from samebits.benchmarks import e2e, steps
from samebits.benchmarks.results import figure, write_json
from samebits.engine.sampling_params import SamplingParams
from samebits.runtime import deterministic_runtime


def timed_step(engine) -> tuple[float, str]:
    """One engine step's wall time (ms, device synchronised before and after) and the kind of step it launched."""
    with StepLog(engine) as log:
        e2e.sync()
        start = time.perf_counter()
        engine.step()
        e2e.sync()
        ms = 1e3 * (time.perf_counter() - start)
    return ms, log.rows[-1][2]


def prompt_step(engine, rng: random.Random, vocab: int, tokens: int, request_id: str) -> tuple[float, str]:
    """The step that prefills a fresh `tokens`-token prompt (random ids: no prefix-cache hit), then the request
    aborted, so the next step is the same load again."""
    engine.add_request(request_id, [rng.randrange(vocab) for _ in range(tokens)],
                       SamplingParams(temperature=0.8, seed=0, max_tokens=16, ignore_eos=True))
    timed = timed_step(engine)
    engine.abort_request(request_id)
    return timed


def median_of(timed: list[tuple[float, str]], kind: str, what: str) -> float:
    """The median time of the steps after the first (untimed: compiles, captures); each must have launched `kind`."""
    wrong = sorted({k for _, k in timed[1:] if k != kind})
    if wrong:
        raise RuntimeError(f"{what}: the scheduler launched {wrong} steps, not {kind!r} (is max_num_batched_tokens "
                           f"at least the decode rows plus the prompt, and max_num_seqs above the decode rows?)")
    return statistics.median(ms for ms, _ in timed[1:])


def measure(loaded, mode: str, decode_rows: list[int], prefill_tokens: list[int], prompt_len: int,
            repeat: int) -> list[dict]:
    with deterministic_runtime() if mode == "deterministic" else contextlib.nullcontext():
        engine = e2e.make_engine(loaded, mode, "dynamic", async_scheduling=False)
        try:
            return measure_engine(engine, loaded.config.vocab_size, decode_rows, prefill_tokens, prompt_len, repeat)
        finally:
            del engine
            if torch.cuda.is_available():
                torch.cuda.empty_cache()


def measure_engine(engine, vocab: int, decode_rows: list[int], prefill_tokens: list[int], prompt_len: int,
                   repeat: int) -> list[dict]:
    rows, rng, mode = [], random.Random(0), engine.config.mode
    for p in prefill_tokens:
        prefill = median_of([prompt_step(engine, rng, vocab, p, f"p{p}-{i}") for i in range(repeat + 1)],
                            "prefill", f"a {p}-token prompt alone")
        for d in decode_rows:
            steps.fill(engine, d, prompt_len, vocab)
            decode = median_of([timed_step(engine) for _ in range(repeat + 1)], "decode", f"{d} decode rows alone")
            mixed = median_of([prompt_step(engine, rng, vocab, p, f"m{d}-{p}-{i}") for i in range(repeat + 1)],
                              "mixed", f"{d} decode rows and a {p}-token prompt")
            for i in range(d):
                engine.abort_request(f"{d}-{i}")
            rows.append({"mode": mode, "decode_rows": d, "prefill_tokens": p, "decode_ms": decode,
                         "prefill_ms": prefill, "mixed_ms": mixed, "ratio": mixed / (decode + prefill)})
            print(json.dumps(rows[-1]), flush=True)
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--shape", default="8b", choices=sorted(e2e.SHAPES))
    ap.add_argument("--modes", default="deterministic,fast")
    ap.add_argument("--decode-rows", default="64,192", help="decoding rows of the decode and mixed steps")
    ap.add_argument("--prefill-tokens", default="512,2048", help="prompt tokens of the prefill and mixed steps")
    ap.add_argument("--prompt-len", type=int, default=512, help="the decoding rows' prompt length")
    ap.add_argument("--repeat", type=int, default=5, help="timed steps of each kind; the median is reported")
    ap.add_argument("--device", default="cuda", help="cpu only for a smoke run with --shape tiny")
    args = ap.parse_args(argv)
    e2e.DEVICE = args.device
    args.out.mkdir(parents=True, exist_ok=True)
    loaded = random_shape_model(args.shape, args.device)
    decode_rows = [int(d) for d in args.decode_rows.split(",")]
    prefill_tokens = [int(p) for p in args.prefill_tokens.split(",")]
    rows = [r for mode in args.modes.split(",")
            for r in measure(loaded, mode, decode_rows, prefill_tokens, args.prompt_len, args.repeat)]
    report = {"shape": args.shape, "device": args.device, "args": vars(args) | {"out": str(args.out)}, "rows": rows}
    write_json(report, args.out / "mixed.json")
    print_table(rows)
    plot(rows, args.out / "mixed.png")
    return 0


def print_table(rows: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="a mixed step against its parts (ms per step)")
    for c in ("mode", "decode rows", "prompt tokens", "decode alone", "prefill alone", "sum", "mixed", "mixed / sum"):
        t.add_column(c)
    for r in rows:
        t.add_row(r["mode"], str(r["decode_rows"]), str(r["prefill_tokens"]), f"{r['decode_ms']:.2f}",
                  f"{r['prefill_ms']:.2f}", f"{r['decode_ms'] + r['prefill_ms']:.2f}", f"{r['mixed_ms']:.2f}",
                  f"{r['ratio']:.2f}")
    Console().print(t)


def plot(rows: list[dict], path: Path) -> None:
    with figure(path, figsize=(9, 3.5)) as (_, ax):
        labels = [f"{r['mode'][:3]} d{r['decode_rows']} p{r['prefill_tokens']}" for r in rows]
        x = range(len(rows))
        ax.bar([i - 0.2 for i in x], [r["decode_ms"] for r in rows], 0.4, label="decode alone")
        ax.bar([i - 0.2 for i in x], [r["prefill_ms"] for r in rows], 0.4, bottom=[r["decode_ms"] for r in rows],
               label="prefill alone")
        ax.bar([i + 0.2 for i in x], [r["mixed_ms"] for r in rows], 0.4, label="mixed step")
        ax.set_xticks(list(x), labels, rotation=20, fontsize=8)
        ax.set_ylabel("ms per step")
        ax.legend()


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    raise SystemExit(main())
