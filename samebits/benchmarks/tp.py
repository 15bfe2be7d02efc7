"""Tensor parallelism (docs/TP.md): bits across TP sizes and modes, throughput, batch-1 latency, all-reduce cost.

For each TP size and mode, one engine over a random-weight model (rank 0 builds it, shards ship to the workers):
- `invariant` (deterministic kernels, all_reduce=invariant): every request's tokens and logprob bits must be equal at
  every TP size;
- `deterministic` (all_reduce=ordered): equal run to run at each size (the load runs twice);
- `native` (deterministic kernels, the library's all-reduce): the route's speed reference;
- `fast` (vendor kernels, native all-reduce): the negative control (its bits are expected to differ across sizes).
64 requests (greedy and sampled, logprobs) at t=0 give the throughput; one request alone gives batch-1 decode latency.
`--collectives` also times the ordered route (all-gather + tree) against the library's all-reduce alone, per size and
message. Writes tp.json and tp.png to --out.

  python -m samebits.benchmarks.tp --device cuda --shape 8b --tp 1,2,4,8          # the multi-GPU run (scripts/tp_gpu.sh)
  python -m samebits.benchmarks.tp --device cpu --shape cpu --tp 1 --modes deterministic,invariant --requests 16
"""
from __future__ import annotations

import argparse
import dataclasses
import datetime
import json
import random
import time
from pathlib import Path

import torch

from samebits.benchmarks.e2e import SHAPES as E2E_SHAPES
from samebits.benchmarks.e2e import NullTokenizer
from samebits.benchmarks.results import figure, write_json
from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import SamplingParams
from samebits.kernels import get_ops
from samebits.models.config import ModelConfig
from samebits.models.loader import LoadedModel
from samebits.models.synthetic import random_model
from samebits.runtime import deterministic_runtime

# Heads, KV heads and intermediate units divisible by 8 (TP_MAX), as TP-invariant mode needs.
SHAPES = {
    "8b": E2E_SHAPES["8b"],
    "1b": E2E_SHAPES["1b"],
    "cpu": {"architecture": "llama", "vocab_size": 4096, "hidden_size": 512, "intermediate_size": 1536,
            "num_layers": 4, "num_heads": 8, "num_kv_heads": 8, "head_dim": 64, "max_position_embeddings": 4096,
            "rope_theta": 500000.0},
}
TP_MODES = {  # name -> (kernel mode, all_reduce)
    "invariant": ("deterministic", "invariant"),
    "deterministic": ("deterministic", "ordered"),
    "native": ("deterministic", "native"),
    "fast": ("fast", "native"),
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--device", default="cuda")
    p.add_argument("--shape", default="8b", choices=sorted(SHAPES))
    p.add_argument("--dtype", default=None, help="default: bfloat16 on cuda, float32 on cpu")
    p.add_argument("--tp", default="1,2,4,8", help="comma-separated TP sizes (those above the GPU count are skipped)")
    p.add_argument("--modes", default="invariant,deterministic,native,fast")
    p.add_argument("--requests", type=int, default=64)
    p.add_argument("--prompt", default="64,512", help="prompt length range")
    p.add_argument("--output", default="32,128", help="output length range")
    p.add_argument("--latency-tokens", type=int, default=64)
    p.add_argument("--kv-tokens", type=int, default=131072)
    p.add_argument("--budget", type=int, default=8192, help="max_num_batched_tokens")
    p.add_argument("--graphs", action="store_true", help="CUDA graphs at TP=1 (TP>1 runs eagerly)")
    p.add_argument("--collectives", action="store_true", help="time the all-reduce routes alone")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--out", type=Path, default=Path("tp_results"))
    return p.parse_args(argv)


def sizes(args) -> list[int]:
    wanted = [int(t) for t in args.tp.split(",")]
    if args.device != "cuda":
        return wanted
    return [t for t in wanted if t <= torch.cuda.device_count()]


def workload(args, vocab: int):
    rng = random.Random(args.seed)
    lo, hi = map(int, args.prompt.split(","))
    olo, ohi = map(int, args.output.split(","))
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(lo, hi))] for _ in range(args.requests)]
    params = [SamplingParams(max_tokens=rng.randint(olo, ohi), ignore_eos=True, logprobs=1, seed=args.seed + i,
                             temperature=0.0 if i % 2 == 0 else 0.8, top_p=1.0 if i % 2 == 0 else 0.95)
              for i in range(args.requests)]
    return prompts, params


def build(args, mode: str, tp: int, loaded) -> LLMEngine:
    kernels, route = TP_MODES[mode]
    loaded.model.set_ops(get_ops(kernels, args.device))
    cfg = EngineConfig(model="random", mode=kernels, device=args.device, dtype=str(loaded.model.dtype),
                       max_num_batched_tokens=args.budget, max_num_seqs=256, kv_cache_tokens=args.kv_tokens,
                       cuda_graphs=args.graphs, tensor_parallel_size=tp, all_reduce=route)
    return LLMEngine(cfg, loaded)


def sync(args) -> None:
    if args.device == "cuda":
        torch.cuda.synchronize()


def run_load(engine, prompts, params) -> tuple[list, float, int]:
    """All requests at t=0 -> (per request: token ids and logprob bits, wall seconds, generated tokens)."""
    t0 = time.perf_counter()
    for i, (p, sp) in enumerate(zip(prompts, params)):
        engine.add_request(str(i), p, sp)
    done = {}
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                done[out.request_id] = out
    wall = time.perf_counter() - t0
    keys = []
    for i in range(len(prompts)):
        c = done[str(i)].outputs[0]
        keys.append([c.token_ids, torch.tensor(c.token_logprobs, dtype=torch.float32).view(torch.int32).tolist()])
    return keys, wall, sum(len(k[0]) for k in keys)


def batch1_latency(engine, prompt, n: int) -> float:
    """Milliseconds per decode token of one request alone (prefill excluded)."""
    engine.add_request("solo", prompt, SamplingParams(max_tokens=n, ignore_eos=True, temperature=0.0))
    stamps = []
    while engine.has_unfinished_requests():
        engine.step()
        stamps.append(time.perf_counter())
    return 1e3 * (stamps[-1] - stamps[0]) / max(1, len(stamps) - 1)


def close(engine) -> None:
    close_fn = getattr(engine.runner, "close", None)
    if close_fn is not None:
        close_fn()


def measure(args, loaded, mode: str, tp: int, prompts, params) -> dict:
    engine = build(args, mode, tp, loaded)
    try:
        run_load(engine, prompts[:2], params[:2])  # warm-up: proofs, compiles, allocator
        keys, wall, tokens = run_load(engine, prompts, params)
        again, _, _ = run_load(engine, prompts, params)
        latency = batch1_latency(engine, prompts[0], args.latency_tokens)
        sync(args)
    finally:
        close(engine)
        del engine
        if args.device == "cuda":
            torch.cuda.empty_cache()
    return {"mode": mode, "tp": tp, "wall_s": wall, "tokens": tokens, "tokens_per_s": tokens / wall,
            "batch1_ms_per_token": latency, "run_to_run_equal": keys == again, "keys": keys}


def compare(rows: list[dict]) -> dict:
    """Per mode: the TP sizes whose bits equal the smallest size's, and the requests that differ otherwise."""
    out = {}
    for mode in sorted({r["mode"] for r in rows}):
        mine = sorted((r for r in rows if r["mode"] == mode), key=lambda r: r["tp"])
        base = mine[0]
        out[mode] = {f"tp{r['tp']}_vs_tp{base['tp']}": {
            "equal": r["keys"] == base["keys"],
            "requests_differing": sum(a != b for a, b in zip(r["keys"], base["keys"])),
            "tokens_differing": sum(x != y for a, b in zip(r["keys"], base["keys"]) for x, y in zip(a[0], b[0]))}
            for r in mine[1:]}
    return out


def scaling(rows: list[dict]) -> dict:
    """Throughput at TP=t over t times TP=1's, per mode."""
    out = {}
    for r in rows:
        one = next((b for b in rows if b["mode"] == r["mode"] and b["tp"] == 1), None)
        if one is not None and r["tp"] > 1:
            out[f"{r['mode']}_tp{r['tp']}"] = r["tokens_per_s"] / (r["tp"] * one["tokens_per_s"])
    return out


def _collective_rank(rank: int, world: int, port: int, device: str, messages, repeats: int, results) -> None:
    from samebits.distributed.group import Group, join_store, open_store
    from samebits.distributed.reduce import reduce_partials

    dev = torch.device("cuda", rank) if device == "cuda" else torch.device("cpu")
    if dev.type == "cuda":
        torch.cuda.set_device(dev)
    store = open_store(world, 120, port) if rank == 0 else join_store(port, world, 120)
    group = Group.open(store, rank, world, dev, 120, 120)
    timings = {}
    for tokens, hidden in messages:
        x = torch.randn(tokens, hidden, device=dev)
        for route in ("ordered", "native"):
            for _ in range(3):
                reduce_partials(x.clone(), group, route)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            t0 = time.perf_counter()
            for _ in range(repeats):
                reduce_partials(x.clone(), group, route)
            if dev.type == "cuda":
                torch.cuda.synchronize()
            timings[f"{route} T={tokens} H={hidden}"] = 1e6 * (time.perf_counter() - t0) / repeats
    if rank == 0:
        results.put(timings)
    group.close()


def collectives(args, world: int, hidden: int) -> dict:
    """Microseconds per row-parallel reduction of [T, H] float32, ordered route vs the library's all-reduce."""
    from samebits.distributed.group import run_ranks

    messages = [(t, hidden) for t in (1, 8, 64, 512, 2048)]
    return run_ranks(_collective_rank, world, (args.device, messages, 20), timeout_s=600)


def random_loaded(args) -> LoadedModel:
    config = ModelConfig(**SHAPES[args.shape])
    dtype = getattr(torch, args.dtype) if args.dtype else (torch.bfloat16 if args.device == "cuda" else torch.float32)
    model = random_model(config, get_ops("deterministic", args.device), dtype, seed=args.seed)
    return LoadedModel(model, NullTokenizer(), config, f"random-{args.shape}", Path("."))


def plot(report: dict, path: Path) -> None:
    with figure(path, 1, 2, figsize=(11, 4)) as (fig, (a, b)):
        for mode in sorted({r["mode"] for r in report["runs"]}):
            mine = sorted((r for r in report["runs"] if r["mode"] == mode), key=lambda r: r["tp"])
            a.plot([r["tp"] for r in mine], [r["tokens_per_s"] for r in mine], marker="o", label=mode)
            b.plot([r["tp"] for r in mine], [r["batch1_ms_per_token"] for r in mine], marker="o", label=mode)
        a.set(xlabel="TP size", ylabel="tokens/s", title=f"{report['requests']} requests at once", xscale="log",
              xticks=[])
        b.set(xlabel="TP size", ylabel="ms / token", title="batch 1 decode", xscale="log")
        for ax in (a, b):
            ax.set_xticks(report["tp_sizes"], [str(t) for t in report["tp_sizes"]])
            ax.legend()
            ax.grid(alpha=0.3)
        fig.suptitle(f"tensor parallelism, {report['shape']} random {report['dtype']}, {report['device_name']}")


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tps, modes = sizes(args), args.modes.split(",")
    with deterministic_runtime():
        loaded = random_loaded(args)
        prompts, params = workload(args, loaded.config.vocab_size)
        rows = []
        for mode in modes:
            for tp in tps:
                row = measure(args, loaded, mode, tp, prompts, params)
                print(json.dumps({k: v for k, v in row.items() if k != "keys"}), flush=True)
                rows.append(row)
        coll = {str(t): collectives(args, t, loaded.config.hidden_size) for t in tps if t > 1} if args.collectives \
            else {}
    device_name = torch.cuda.get_device_name(0) if args.device == "cuda" else "cpu"
    report = {"date": datetime.datetime.now(datetime.UTC).isoformat(), "shape": args.shape,
              "dtype": str(loaded.model.dtype), "device_name": device_name, "tp_sizes": tps,
              "requests": args.requests, "args": {k: str(v) for k, v in vars(args).items()},
              "bits_across_tp": compare(rows), "scaling_efficiency": scaling(rows), "collectives_us": coll,
              "runs": [{k: v for k, v in r.items() if k != "keys"} for r in rows],
              "model": dataclasses.asdict(loaded.config)}
    write_json(report, args.out / "tp.json", sort_keys=True)
    plot(report, args.out / "tp.png")
    print(json.dumps({k: report[k] for k in ("bits_across_tp", "scaling_efficiency")}, indent=2))
    return 0


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    raise SystemExit(main())
