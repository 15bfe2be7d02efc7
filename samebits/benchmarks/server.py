"""Server benchmark: N concurrent requests through the real HTTP server, each checked against its solo run.

    python -m samebits.benchmarks.server --model PATH_OR_NAME --out results/          # a checkpoint the engine can load
    python -m samebits.benchmarks.server --random-shape 8b --out results/             # 8B-shaped random bf16 weights (GPU)
    python -m samebits.benchmarks.server --random-shape tiny --device cpu --requests 8 --out /tmp/b   # smoke test on CPU

Starts the server in-process on 127.0.0.1 (uvicorn in a thread), fires all requests at once (half streamed, half
not), then replays each one alone and compares token ids and logprob values exactly. Writes server_bench.json into
--out and exits 1 if any request differs from its solo run.

Solo replays are sequential, so at 8B with 128-512 output tokens only the first ones fit --solo-budget-s (the JSON
says how many were checked); for a check of every request, shorten the outputs (--output-len 32 64).
"""
from __future__ import annotations

import argparse
import asyncio
import dataclasses
import functools
import json
import random
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import httpx

from samebits.bench.report import args_json
from samebits.benchmarks.results import figure, write_json
from samebits.server.config import ServerConfig

SERVED_NAME = "bench"
SHAPES = {
    # Llama-3-8B's shape; the weights are random (N(0, 0.02)), which costs the same FLOPs and bytes.
    "8b": {"vocab_size": 128256, "hidden_size": 4096, "intermediate_size": 14336, "num_hidden_layers": 32,
           "num_attention_heads": 32, "num_key_value_heads": 8, "max_position_embeddings": 8192,
           "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                            "original_max_position_embeddings": 8192}},
    "tiny": {},
}


@dataclass
class Result:
    index: int
    status: int = 0
    ids: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    ttft_s: float | None = None
    latency_s: float = 0.0
    error: str | None = None


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--model", help="checkpoint folder, .gguf or registered name")
    src.add_argument("--random-shape", choices=sorted(SHAPES), help="random weights of this shape, no files")
    p.add_argument("--mode", default="deterministic", choices=("deterministic", "fast"))
    p.add_argument("--device", default=None)
    p.add_argument("--dtype", default=None, help="default: the loader's (bf16 on GPU); random shapes use bf16")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--concurrency", type=int, default=None, help="in flight at once (default: all)")
    p.add_argument("--input-len", type=int, nargs=2, default=(128, 1024), metavar=("MIN", "MAX"))
    p.add_argument("--output-len", type=int, nargs=2, default=(128, 512), metavar=("MIN", "MAX"))
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--max-num-seqs", type=int, default=256)
    p.add_argument("--max-num-batched-tokens", type=int, default=8192)
    p.add_argument("--max-model-len", type=int, default=None)
    p.add_argument("--engine-config", default="{}", help="extra EngineConfig fields as JSON")
    p.add_argument("--solo-budget-s", type=float, default=300.0,
                   help="stop replaying solo runs after this long (the JSON says how many were checked)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--switch-interval", type=float, default=None,
                   help="sys.setswitchinterval for the run: how long the engine thread may wait for the GIL")
    p.add_argument("--skip-offline", action="store_true", help="skip the same workload through the offline engine")
    p.add_argument("--engine-process", action="store_true",
                   help="serve with the engine in its own process (ServerConfig.engine_process); the offline run's "
                        "engine is freed first and its KV cache size kept")
    p.add_argument("--data-parallel-size", type=int, default=None,
                   help="serve through a fleet of this many Ray replicas (samebits/fleet; 1: one replica behind the "
                        "router, to compare with the plain server)")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


# ---- engine --------------------------------------------------------------------------------------------------------
def engine_config(args):
    from samebits.engine.config import EngineConfig

    extra = json.loads(args.engine_config)
    model = args.model or f"random-{args.random_shape}"
    return EngineConfig.from_dict({"model": model, "mode": args.mode, "device": args.device, "dtype": args.dtype,
                                   "max_num_seqs": args.max_num_seqs,
                                   "max_num_batched_tokens": args.max_num_batched_tokens,
                                   "max_model_len": args.max_model_len, **extra})


def loaded_factory(shape: str, mode: str, device: str | None, dtype: str | None):
    """A picklable factory of a LoadedModel with random weights of `shape` and the tiny test tokenizer (prompts are
    token ids anyway); an engine process calls it to build its model."""
    from samebits.models.synthetic import random_loaded as random_of

    return functools.partial(random_of, SHAPES[shape], f"random-{shape}", mode, device, dtype)


def random_loaded(shape: str, mode: str, device: str | None, dtype: str | None):
    return loaded_factory(shape, mode, device, dtype)()


def args_factory(args):
    return loaded_factory(args.random_shape, args.mode, args.device, args.dtype) if args.random_shape else None


def build_engine(args):
    from samebits.engine.llm_engine import LLMEngine

    factory = args_factory(args)
    return LLMEngine(engine_config(args), loaded=factory() if factory else None)


# ---- requests ------------------------------------------------------------------------------------------------------
def make_requests(args, vocab_size: int, max_model_len: int) -> list[dict]:
    rng = random.Random(args.seed)
    reqs = []
    for i in range(args.requests):
        n_in = rng.randint(*args.input_len)
        n_out = min(rng.randint(*args.output_len), max_model_len - n_in)
        ids = [rng.randrange(3, vocab_size) for _ in range(n_in)]
        reqs.append({"model": SERVED_NAME, "prompt": ids, "max_tokens": n_out, "temperature": args.temperature,
                     "seed": 10_000 + i, "logprobs": 0, "ignore_eos": True, "stream": i % 2 == 1})
    return reqs


def warm_up_requests(reqs: list[dict], vocab_size: int) -> list[dict]:
    """The workload's shapes (prompt lengths, batch sizes) at 4 output tokens, on other token ids: no prompt of the
    measured run finds its prefix cached."""
    return [{**r, "max_tokens": 4, "prompt": [3 + (t - 2) % (vocab_size - 3) for t in r["prompt"]]} for r in reqs]


def parse_body(res: Result, data: dict) -> None:
    c = data["choices"][0]
    res.ids, res.logprobs = c["token_ids"], c["logprobs"]["token_logprobs"]


async def parse_stream(res: Result, r: httpx.Response, start: float) -> None:
    async for line in r.aiter_lines():
        if not line.startswith("data: ") or line == "data: [DONE]":
            continue
        obj = json.loads(line[6:])
        if "error" in obj:
            res.error = obj["error"]["message"]
            return
        for c in obj["choices"]:
            if c["token_ids"] and res.ttft_s is None:
                res.ttft_s = time.perf_counter() - start
            res.ids += c["token_ids"]
            res.logprobs += c["logprobs"]["token_logprobs"] if c["logprobs"] else []


async def one(http: httpx.AsyncClient, i: int, req: dict) -> Result:
    res, start = Result(i), time.perf_counter()
    async with http.stream("POST", "/v1/completions", json=req) as r:
        res.status = r.status_code
        if r.status_code != 200:
            res.error = (await r.aread()).decode(errors="replace")[:500]
        elif req["stream"]:
            await parse_stream(res, r, start)
        else:
            parse_body(res, json.loads(await r.aread()))
    res.latency_s = time.perf_counter() - start
    return res


async def fire(url: str, reqs: list[dict], concurrency: int) -> tuple[list[Result], float]:
    gate = asyncio.Semaphore(concurrency)
    limits = httpx.Limits(max_connections=concurrency + 8, max_keepalive_connections=concurrency + 8)
    async with httpx.AsyncClient(base_url=url, timeout=httpx.Timeout(3600.0), limits=limits) as http:
        async def guarded(i, req):
            async with gate:
                return await one(http, i, req)

        start = time.perf_counter()
        results = await asyncio.gather(*(guarded(i, r) for i, r in enumerate(reqs)))
        return list(results), time.perf_counter() - start


class StepLog:
    """engine.step wrapped: each step's duration and running batch, to tell a slower step (the GIL shared with the
    event loop) from smaller batches (requests arriving late) or an idle engine thread (waits between steps)."""

    def __init__(self, engine) -> None:
        self.step, self.rows = engine.step, []
        engine.step = self

    def __call__(self):
        start = time.perf_counter()
        running = self.step.__self__.scheduler.stats()["num_running"]
        out = self.step()
        self.rows.append((start, time.perf_counter() - start, running))
        return out

    def summary(self, since: float, until: float) -> dict:
        rows = [r for r in self.rows if since <= r[0] < until]
        busy = sum(r[1] for r in rows)
        return {"steps": len(rows), "in_step_s": busy, "between_steps_s": (until - since) - busy,
                "mean_step_ms": 1e3 * busy / max(1, len(rows)),
                "mean_running": statistics.fmean(r[2] for r in rows) if rows else 0.0}


def offline_run(engine, reqs: list[dict]) -> tuple[list[Result], float]:
    """The same requests straight into the engine (no HTTP, no engine thread): the throughput serving is held to."""
    from samebits.engine.sampling_params import SamplingParams

    for i, r in enumerate(reqs):
        engine.add_request(f"offline-{i}", r["prompt"], SamplingParams(
            temperature=r["temperature"], seed=r["seed"], max_tokens=r["max_tokens"], logprobs=0, ignore_eos=True))
    results = {}
    start = time.perf_counter()
    while engine.has_unfinished_requests():
        for out in engine.step():
            if out.finished:
                c = out.outputs[0]
                results[int(out.request_id.split("-")[1])] = Result(0, 200, list(c.token_ids), list(c.token_logprobs))
    wall = time.perf_counter() - start
    engine.scheduler.reset_prefix_cache()  # the server's run must not find these prompts cached
    return [results[i] for i in range(len(reqs))], wall


def fire_elsewhere(url: str, reqs: list[dict], concurrency: int) -> tuple[list[Result], float, float]:
    """`fire` from a child process: the client's JSON and HTTP work must not take the server's GIL, as a real
    client's does not. Also returns when it started (perf_counter is the system's monotonic clock on Linux)."""
    import concurrent.futures
    import multiprocessing

    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_fire_sync, url, reqs, concurrency).result()


def _fire_sync(url: str, reqs: list[dict], concurrency: int) -> tuple[list[Result], float, float]:
    start = time.perf_counter()
    return (*asyncio.run(fire(url, reqs, concurrency)), start)


def solo_runs(url: str, reqs: list[dict], budget_s: float) -> tuple[list[Result], float]:
    start, out = time.perf_counter(), []
    for i, req in enumerate(reqs):
        if time.perf_counter() - start > budget_s:
            break
        out.append(asyncio.run(fire(url, [req], 1))[0][0])
        out[-1].index = i
    return out, time.perf_counter() - start


# ---- report --------------------------------------------------------------------------------------------------------
def pct(values: list[float], q: float) -> float | None:
    values = sorted(v for v in values if v is not None)
    if not values:
        return None
    return values[min(len(values) - 1, int(q * len(values)))]


def summarize(results: list[Result], wall: float, solo: list[Result], solo_wall: float, reqs: list[dict]) -> dict:
    tokens = sum(len(r.ids) for r in results)
    mismatched = [s.index for s in solo if (s.ids, s.logprobs) != (results[s.index].ids, results[s.index].logprobs)]
    failed = [r.index for r in results if r.status != 200 or r.error]
    return {
        "requests": len(results), "failed": failed, "prompt_tokens": sum(len(r["prompt"]) for r in reqs),
        "output_tokens": tokens, "wall_s": wall, "output_tokens_per_s": tokens / wall,
        "requests_per_s": len(results) / wall,
        "ttft_s": {"p50": pct([r.ttft_s for r in results], 0.5), "p99": pct([r.ttft_s for r in results], 0.99)},
        "latency_s": {"p50": pct([r.latency_s for r in results], 0.5),
                      "p99": pct([r.latency_s for r in results], 0.99),
                      "mean": statistics.fmean(r.latency_s for r in results)},
        "solo": {"checked": len(solo), "equal": len(solo) - len(mismatched), "mismatched": mismatched,
                 "wall_s": solo_wall},
        "all_checked_equal": not mismatched and not failed,
    }


def run(args) -> dict:
    from samebits.engine.async_engine import AsyncEngine
    from samebits.server.app import build_app
    from samebits.server.serve import ServerThread, template

    config = ServerConfig.from_dict({"model": SERVED_NAME, "port": 0, "mode": args.mode,
                                     "max_waiting": max(1024, args.requests), "max_num_seqs": args.max_num_seqs,
                                     "log_level": "warning"})
    with template(config):
        t0 = time.perf_counter()
        engine = build_engine(args)
        load_s = time.perf_counter() - t0
        log = StepLog(engine)
        offline = None
        if not args.skip_offline:
            reqs = make_requests(args, engine.loaded.config.vocab_size, engine.max_model_len)
            # Warm-up at every shape the workload meets (route proofs, compiles, graph captures), for both runs.
            offline_run(engine, [{**r, "max_tokens": 4} for r in reqs])
            t = time.perf_counter()
            offline = (*offline_run(engine, reqs), log.summary(t, time.perf_counter()))
        if args.engine_process or args.data_parallel_size:
            kv_tokens = engine.runner.num_blocks * engine.runner.block_size
            del engine, log  # freed before the child loads: its weights and cache would halve the child's memory
            make = fleet_engine if args.data_parallel_size else process_engine
            async_engine, log = make(args, config, kv_tokens), None
            engine = async_engine.engine
        else:
            async_engine = AsyncEngine(engine, max_waiting=config.engine.max_waiting)
        server = ServerThread(build_app(async_engine, config), config)
        try:
            return measure(args, engine, server.url, load_s, offline, log)
        finally:
            server.stop()
            async_engine.shutdown()


def process_engine(args, config, kv_tokens: int):
    """The server's engine in its own process, with the offline engine's KV cache size (the same steps)."""
    import gc

    import torch

    from samebits.server.serve import build_async_engine

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    child = engine_config(args).replace(kv_cache_tokens=kv_tokens, max_waiting=config.engine.max_waiting)
    return build_async_engine(dataclasses.replace(config, engine=child, engine_process=True), args_factory(args))


def fleet_engine(args, config, kv_tokens: int):
    """The server's engine as a fleet of Ray replicas (each one engine like the offline one, its KV cache too)."""
    import gc

    import torch

    from samebits.fleet.engine import FleetEngine

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
    child = engine_config(args).replace(kv_cache_tokens=kv_tokens, max_waiting=config.engine.max_waiting,
                                        data_parallel_size=args.data_parallel_size)
    factory = args_factory(args)
    make = functools.partial(replica_engine, factory) if factory else None
    return FleetEngine(child, max_waiting=config.engine.max_waiting, max_waiting_tokens=config.max_waiting_tokens,
                       make_engine=make)


def replica_engine(factory, config):
    """A replica's LLMEngine on the benchmark's random weights (picklable: it crosses to the Ray actor)."""
    from samebits.engine.llm_engine import LLMEngine

    return LLMEngine(config, loaded=factory())


def measure(args, engine, url: str, load_s: float, offline: tuple | None, log: StepLog | None) -> dict:
    fresh = args.engine_process or args.data_parallel_size  # the engine is elsewhere: read through its view
    vocab = engine.vocab_size if fresh else engine.loaded.config.vocab_size
    reqs = make_requests(args, vocab, engine.max_model_len)
    asyncio.run(fire(url, [{**reqs[0], "max_tokens": 4}], 1))  # warm-up: first-call allocations, graph capture
    if fresh:  # a fresh engine: warm it at every shape, as the offline runs warmed the thread's
        fire_elsewhere(url, warm_up_requests(reqs, vocab), args.concurrency or len(reqs))
    results, wall, start = fire_elsewhere(url, reqs, args.concurrency or len(reqs))
    # The engine process's steps are not logged here (they run in the child); the wall time says what they cost.
    served = log.summary(start, start + wall) if log is not None else None
    solo, solo_wall = solo_runs(url, reqs, args.solo_budget_s)
    report = summarize(results, wall, solo, solo_wall, reqs)
    report["load_s"] = load_s
    report["engine_steps"] = served
    if offline is not None:
        ran, offline_wall, steps = offline
        tokens = sum(len(r.ids) for r in ran)
        report["offline"] = {"wall_s": offline_wall, "output_tokens_per_s": tokens / offline_wall, "engine_steps": steps,
                             "server_over_offline": report["output_tokens_per_s"] / (tokens / offline_wall),
                             "equal_to_server": sum((a.ids, a.logprobs) == (b.ids, b.logprobs)
                                                    for a, b in zip(ran, results))}
    report["fingerprint"] = httpx.get(f"{url}/version", timeout=30).json()
    report["args"] = args_json(args)
    report["first_failures"] = [asdict(r) | {"ids": None, "logprobs": None} for r in results if r.error][:5]
    return report


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    default = sys.getswitchinterval()
    sys.setswitchinterval(args.switch_interval or default)
    try:
        report = run(args)
    finally:
        sys.setswitchinterval(default)
    name = "server_bench" + (".process" if args.engine_process else "") + (
        f".dp{args.data_parallel_size}" if args.data_parallel_size else "")
    path = args.out / (f"{name}.si{args.switch_interval}.json" if args.switch_interval else f"{name}.json")
    write_json(report, path)
    s = report["solo"]
    print(f"{report['requests']} requests, {report['output_tokens']} tokens in {report['wall_s']:.1f}s = "
          f"{report['output_tokens_per_s']:.0f} tok/s; solo-checked {s['checked']}: {s['equal']} equal, "
          f"mismatched {s['mismatched']}; failed {report['failed']}; wrote {path}")
    if "offline" in report:
        o = report["offline"]
        print(f"offline engine: {o['output_tokens_per_s']:.0f} tok/s in {o['wall_s']:.1f}s; server / offline = "
              f"{o['server_over_offline']:.2f}; {o['equal_to_server']} of {report['requests']} equal to the server's")
        for name, st in (("offline", o["engine_steps"]), ("server", report["engine_steps"])):
            if st is None:
                continue
            print(f"  {name}: {st['steps']} steps, {st['mean_step_ms']:.2f} ms each, {st['mean_running']:.0f} running, "
                  f"{st['in_step_s']:.1f} s in steps, {st['between_steps_s']:.1f} s between")
    rows = table_rows(report)
    print_table(rows)
    plot(rows, path.with_suffix(".png"))
    return 0 if report["all_checked_equal"] else 1


def table_rows(report: dict) -> list[tuple[str, float, float, dict | None]]:
    """(run, output tok/s, wall s, its engine-step log) for the offline engine, if run, and the server."""
    rows = []
    if "offline" in report:
        o = report["offline"]
        rows.append(("offline engine", o["output_tokens_per_s"], o["wall_s"], o["engine_steps"]))
    backend = "engine process" if report["args"].get("engine_process") else "engine thread"
    rows.append((f"server ({backend})", report["output_tokens_per_s"], report["wall_s"], report["engine_steps"]))
    return rows


def print_table(rows) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="server vs offline engine, same requests")
    for c in ("run", "tok/s", "wall s", "steps", "ms/step", "running"):
        t.add_column(c)
    for name, tps, wall, st in rows:
        steps = ("-", "-", "-") if st is None else (str(st["steps"]), f"{st['mean_step_ms']:.1f}",
                                                     f"{st['mean_running']:.0f}")
        t.add_row(name, f"{tps:.0f}", f"{wall:.1f}", *steps)
    Console().print(t)


def plot(rows, path: Path) -> None:
    with figure(path, figsize=(6, 3.2)) as (_, ax):
        ax.barh([r[0] for r in rows], [r[1] for r in rows])
        ax.set_xlabel("output tokens / s")
        ax.set_title("same requests: offline engine vs HTTP server")


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    sys.exit(main())
