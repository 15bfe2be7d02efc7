"""Server CPU benchmark: the serving process's CPU per output token, with no model in it.

    python -m samebits.benchmarks.server_cpu --out results/                      # both backends, 256 requests, half streamed
    python -m samebits.benchmarks.server_cpu --backend process --profile --out /tmp/b    # + yappi's top functions per thread

The real app (server/app.py build_app on uvicorn) serves a `ReplayEngine`: it steps at a fixed period (sleeping, no
CPU) and hands out precomputed cumulative outputs, one new token per running sample per step, as a decode step does.
The clients run in another process and only read bytes until the server closes, so nearly all the CPU measured is the
server's. Each thread's CPU time (the kernel's per-thread clock, no profiler) is split into the event loop, the engine
thread (AsyncEngine's, less the replay's own output building: that is the engine's step), the engine process's
receiver, and the rest. After the run every response is parsed and checked against the replayed tokens. Each backend
runs --repeat times and the least CPU is kept (this counts CPU time, but a machine shared with other work still
inflates it). Writes server_cpu.json into --out.

Its runs (before and after the server work and the SSE rewrite): docs/results/HISTORY.md, "Host step and server
CPU".
"""
from __future__ import annotations

import argparse
import asyncio
import concurrent.futures
import dataclasses
import json
import multiprocessing
import os
import random
import struct
import sys
import tempfile
import threading
import time
from pathlib import Path

from samebits.bench.report import save_runs
from samebits.engine.outputs import CompletionOutput, EngineInfo, EngineStats, RequestOutput, StepProgress
from samebits.engine.sampling_params import RequestOutputKind
from samebits.engine.seeds import SeedStream

SERVED_NAME = "bench"
FINGERPRINT = {"hash": "replay", "samebits": "replay", "torch": None, "cuda_runtime": None, "cublas": None,
               "driver": None, "numerics_profile": "replay", "mode": "deterministic", "weights": None, "dtype": None,
               "tensor_parallel": {"size": 1, "all_reduce": None, "invariant": False}}


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


def replay_tokens(prompt: list[int], n: int, vocab: list[int]) -> list[int]:
    """What the replay draws for a prompt: a function of the prompt alone, so the run can be checked."""
    rng = random.Random(hash(tuple(prompt)))
    return [rng.choice(vocab) for _ in range(n)]


def replay_logprob(token: int, position: int) -> float:
    return _f32(-((token * 7919 + position * 104729) % 100000) / 9973.0)


def tiny_tokenizer():
    from samebits.models.synthetic import write_tiny_checkpoint
    from samebits.models.tokenizer import Tokenizer

    return Tokenizer.from_hf_dir(write_tiny_checkpoint(Path(tempfile.mkdtemp(prefix="samebits-tok-"))))


def clean_vocab(tokenizer) -> list[int]:
    """Token ids whose text is whole characters, so every step's text is final (no held-back split character)."""
    return [t for t in range(3, tokenizer.vocab_size) if "\ufffd" not in tokenizer.decode([t])]


@dataclasses.dataclass
class _Replay:
    request_id: str
    prompt: str | None
    prompt_ids: list[int]
    seed: int
    samples: list[tuple[list[int], list[float], list[dict], str, list[int]]]  # ids, logprobs, tops, text, offsets
    logprobs: int | None
    final_only: bool
    produced: int = 0


class ReplayEngine:
    """LLMEngine's interface over precomputed outputs: every running sample gains one token per step, and a step
    lasts `step_s` (slept, so the server's threads have the CPU). `step_cpu_s` is the CPU spent building outputs,
    the part of a real step that stays in the engine."""

    def __init__(self, config=None, loaded=None, *, step_s: float = 0.02):
        self.tokenizer = tiny_tokenizer()
        self.vocab = clean_vocab(self.tokenizer)
        self.text = {t: self.tokenizer.decode([t]) for t in self.vocab}
        self.step_s, self.step_cpu_s, self.steps = step_s, 0.0, 0
        self.model_name, self.vocab_size, self.max_model_len = "replay", self.tokenizer.vocab_size, 1 << 20
        self.requests: dict[str, _Replay] = {}
        self._seeds = SeedStream(0)
        self._tick = 0.0
        self._progress: list[StepProgress] = []

    def info(self) -> EngineInfo:
        return EngineInfo("replay", "replay", "deterministic", self.vocab_size, self.max_model_len, "float32", "cpu",
                          0, 16)

    def fingerprint(self) -> dict:
        return FINGERPRINT

    def draw_seed(self) -> int:
        return self._seeds.draw()

    def validate(self, prompt_token_ids, params, where="prompt") -> None:
        pass

    def add_request(self, request_id, prompt_token_ids, params, prompt=None, resume=None) -> None:
        if resume is not None:
            raise ValueError("resume: the replay engine continues no sent output")
        ids = replay_tokens(list(prompt_token_ids), params.max_tokens, self.vocab)
        samples = []
        for _ in range(params.n):
            lps = [replay_logprob(t, i) for i, t in enumerate(ids)]
            tops = [{(t + k) % self.vocab_size: _f32(-k - 0.5) for k in range(params.logprobs or 0)} for t in ids]
            offsets = [0]
            for t in ids:
                offsets.append(offsets[-1] + len(self.text[t]))
            samples.append((ids, lps, tops, "".join(self.text[t] for t in ids), offsets))
        seed = params.seed if params.seed is not None else self.draw_seed()
        self.requests[request_id] = _Replay(request_id, prompt, list(prompt_token_ids), seed, samples,
                                            params.logprobs, params.output_kind is RequestOutputKind.FINAL_ONLY)

    def abort_request(self, request_id) -> None:
        self.requests.pop(request_id, None)

    def has_unfinished_requests(self) -> bool:
        return bool(self.requests)

    def step(self) -> list[RequestOutput]:
        wait = self._tick - time.monotonic()
        if wait > 0:
            time.sleep(wait)
        self._tick = max(self._tick, time.monotonic()) + self.step_s
        start = time.thread_time()
        running = list(self.requests.values())
        self._progress = [StepProgress(r.request_id, len(r.samples), None) for r in running]
        outs = [out for out in map(self._advance, running) if out is not None]
        self.step_cpu_s += time.thread_time() - start
        self.steps += 1
        return outs

    def progress(self) -> list[StepProgress]:
        return self._progress

    def _advance(self, r: _Replay) -> RequestOutput | None:
        """One more token per sample; the cumulative output, unless it is not due (FINAL_ONLY, unfinished)."""
        r.produced += 1
        k = r.produced
        done = k == len(r.samples[0][0])
        if done:
            del self.requests[r.request_id]
        elif r.final_only:
            return None
        want = r.logprobs is not None
        # Fresh lists every step, as OutputProcessor._completion builds them.
        outputs = [CompletionOutput(i, text[:offsets[k]], ids[:k], lps[:k] if want else None,
                                    tops[:k] if want else None, float(sum(lps[:k])), "length" if done else None)
                   for i, (ids, lps, tops, text, offsets) in enumerate(r.samples)]
        return RequestOutput(r.request_id, r.prompt, r.prompt_ids, outputs, 0, r.seed, "replay", done,
                             first_scheduled_time=time.monotonic())

    def stats(self) -> EngineStats:
        return EngineStats(len(self.requests), 0, 0.0, 0, 0, 0, 0, 0)


# ---- clients (another process) -------------------------------------------------------------------------------------
async def _fetch(host: str, port: int, body: bytes) -> bytes:
    reader, writer = await asyncio.open_connection(host, port)
    writer.write(b"POST /v1/completions HTTP/1.1\r\nhost: bench\r\ncontent-type: application/json\r\n"
                 b"connection: close\r\ncontent-length: %d\r\n\r\n%s" % (len(body), body))
    data = await reader.read()  # to the server's close: no parsing while the server runs
    writer.close()
    return data


async def _fetch_all(host: str, port: int, bodies: list[bytes]) -> list[bytes]:
    return list(await asyncio.gather(*(_fetch(host, port, b) for b in bodies)))


def fetch_elsewhere(host: str, port: int, bodies: list[bytes]) -> list[bytes]:
    with concurrent.futures.ProcessPoolExecutor(1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(_fetch_sync, host, port, bodies).result()


def _fetch_sync(host: str, port: int, bodies: list[bytes]) -> list[bytes]:
    return asyncio.run(_fetch_all(host, port, bodies))


def requests_for(args, seed: int, count: int, max_tokens: int) -> list[dict]:
    rng = random.Random(seed)
    return [{"model": SERVED_NAME, "prompt": [rng.randrange(3, 300) for _ in range(args.prompt_len)],
             "max_tokens": max_tokens, "temperature": 0.7, "seed": i, "n": args.n, "ignore_eos": True,
             **({"logprobs": args.logprobs} if args.logprobs >= 0 else {}), "stream": i % 2 == 1}
            for i in range(count)]


# ---- checking ------------------------------------------------------------------------------------------------------
def dechunk(body: bytes) -> bytes:
    out, at = [], 0
    while True:
        end = body.index(b"\r\n", at)
        size = int(body[at:end], 16)
        if size == 0:
            return b"".join(out)
        out.append(body[end + 2:end + 2 + size])
        at = end + 4 + size


def received(raw: bytes, stream: bool) -> tuple[dict[int, list[int]], dict[int, list[float]], int]:
    """(token ids per choice, token logprobs per choice, SSE events with tokens) of one raw response."""
    head, _, body = raw.partition(b"\r\n\r\n")
    if not head.startswith(b"HTTP/1.1 200"):
        raise AssertionError(f"the server answered {head[:200]!r}: {body[:300]!r}")
    chunked = b"transfer-encoding: chunked" in head.lower()
    body = dechunk(body) if chunked else body
    objs = [json.loads(e[6:]) for e in body.split(b"\n\n") if e.startswith(b"data: {")] if stream else [json.loads(body)]
    ids: dict[int, list[int]] = {}
    lps: dict[int, list[float]] = {}
    events = 0
    for obj in objs:
        for c in obj["choices"]:
            ids.setdefault(c["index"], []).extend(c["token_ids"])
            lps.setdefault(c["index"], []).extend((c["logprobs"] or {}).get("token_logprobs") or [])
            events += bool(c["token_ids"])
    return ids, lps, events


def check(raws: list[bytes], reqs: list[dict], async_engine) -> int:
    """Raise unless every response holds the replayed tokens (and logprobs); returns the streams' token events."""
    vocab, events = clean_vocab(async_engine.engine.tokenizer), 0
    for raw, req in zip(raws, reqs):
        ids, lps, e = received(raw, req["stream"])
        want = replay_tokens(req["prompt"], req["max_tokens"], vocab)
        for j in range(req["n"]):
            assert ids[j] == want, f"seed {req['seed']} choice {j}: tokens differ"
            if "logprobs" in req:
                assert lps[j] == [replay_logprob(t, i) for i, t in enumerate(want)], f"seed {req['seed']}: logprobs"
        events += e if req["stream"] else 0
    return events


# ---- CPU per thread ------------------------------------------------------------------------------------------------
def thread_cpu() -> dict[str, float]:
    """CPU seconds of each live thread of this process, by thread name."""
    out: dict[str, float] = {}
    for t in threading.enumerate():
        try:
            seconds = time.clock_gettime(time.pthread_getcpuclockid(t.ident))
        except (OSError, TypeError):
            continue
        out[t.name] = out.get(t.name, 0.0) + seconds
    return out


def process_cpu(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


GROUPS = {"samebits-uvicorn": "event loop", "samebits-engine": "engine thread",
          "samebits-engine-receiver": "receiver"}


def grouped(before: dict[str, float], after: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for name, seconds in after.items():
        group = GROUPS.get(name, "other threads")
        out[group] = out.get(group, 0.0) + seconds - before.get(name, 0.0)
    return out


# ---- one backend ---------------------------------------------------------------------------------------------------
def build(backend: str, step_s: float, config):
    import functools

    from samebits.engine.async_engine import AsyncEngine
    from samebits.engine.engine_process import ProcessAsyncEngine

    if backend == "thread":
        return AsyncEngine(ReplayEngine(step_s=step_s), max_waiting=config.engine.max_waiting)
    return ProcessAsyncEngine(config.engine, max_waiting=config.engine.max_waiting,
                              make_engine=functools.partial(ReplayEngine, step_s=step_s))


def measure(args, backend: str) -> dict:
    """The workload `args.repeat` times on one server; the run with the least parent CPU (the others were slowed by
    whatever else shared the machine), with every run's total beside it."""
    from samebits.server.app import build_app
    from samebits.server.config import ServerConfig
    from samebits.server.serve import ServerThread

    config = ServerConfig.from_dict({"model": SERVED_NAME, "port": 0, "max_waiting": max(1024, 2 * args.requests),
                                     "max_n": max(16, args.n), "max_connections": 4 * args.requests,
                                     "log_level": "warning"})
    async_engine = build(backend, args.step_ms / 1e3, config)
    server = ServerThread(build_app(async_engine, config), config)
    address = server.sock.getsockname()[:2]
    try:
        warm = requests_for(args, args.seed + 1, min(args.requests, 32), 8)
        check(fetch_elsewhere(*address, [json.dumps(r).encode() for r in warm]), warm, async_engine)
        runs = [run_once(args, backend, address, async_engine) for _ in range(args.repeat)]
    finally:
        server.stop()
        async_engine.shutdown()
    best = min(runs, key=lambda r: r["parent_us_per_token"])
    best["repeats_parent_us_per_token"] = [r["parent_us_per_token"] for r in runs]
    return best


def run_once(args, backend: str, address: tuple, async_engine) -> dict:
    reqs = requests_for(args, args.seed, args.requests, args.output_len)
    bodies = [json.dumps(r).encode() for r in reqs]
    child = getattr(async_engine, "process", None)
    replay = async_engine.engine if backend == "thread" else None
    profiler = _profile_start() if args.profile else None
    cpu0, child0 = thread_cpu(), child and process_cpu(child.pid)
    step0, steps0 = (replay.step_cpu_s, replay.steps) if replay else (0.0, 0)
    start = time.perf_counter()
    raws = fetch_elsewhere(*address, bodies)
    wall = time.perf_counter() - start
    cpu = grouped(cpu0, thread_cpu())
    report = {"backend": backend, "wall_s": wall, "cpu_s": cpu, "top_functions": profiler and _profile_stop(profiler)}
    if replay is not None:
        report["replay_step_cpu_s"] = replay.step_cpu_s - step0
        report["steps"] = replay.steps - steps0
        cpu["engine thread"] -= report["replay_step_cpu_s"]  # the engine's own work, not the server's
    if child is not None:
        report["engine_process_cpu_s"] = process_cpu(child.pid) - child0
    tokens = args.requests * args.n * args.output_len
    streamed = sum(r["stream"] for r in reqs) * args.n * args.output_len
    report.update(output_tokens=tokens, stream_events_per_token=check(raws, reqs, async_engine) / max(1, streamed),
                  us_per_token={k: 1e6 * v / tokens for k, v in cpu.items()},
                  parent_us_per_token=1e6 * sum(cpu.values()) / tokens)
    report["parent_ms_per_step"] = report["parent_us_per_token"] * args.requests * args.n / 1e3
    return report


def _profile_start():
    import yappi

    yappi.set_clock_type("cpu")
    yappi.clear_stats()
    yappi.start()
    return yappi


def _profile_stop(yappi, limit: int = 25) -> dict[str, list]:
    """Per thread group: the functions with the most own CPU (tsub), as (name, own s, total s, calls)."""
    yappi.stop()
    names = {t.ident: t.name for t in threading.enumerate()}
    out: dict[str, list] = {}
    for t in yappi.get_thread_stats():
        stats = sorted(yappi.get_func_stats(filter={"ctx_id": t.id}), key=lambda f: -f.tsub)[:limit]
        rows = [(f"{f.module.rsplit('/', 1)[-1]}:{f.lineno} {f.name}", f.tsub, f.ttot, f.ncall) for f in stats]
        if rows and rows[0][1] > 0.01:
            out[GROUPS.get(names.get(t.tid), names.get(t.tid, t.name))] = rows
    yappi.clear_stats()
    return out


# ---- report --------------------------------------------------------------------------------------------------------
def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--backend", choices=("thread", "process", "both"), default="both")
    p.add_argument("--requests", type=int, default=256)
    p.add_argument("--output-len", type=int, default=256)
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--n", type=int, default=1)
    p.add_argument("--logprobs", type=int, default=0, help="logprobs per request (-1: none), as server.py")
    p.add_argument("--step-ms", type=float, default=50.0,
                   help="the replayed step's period: long enough that the server keeps up (events/tok 1.00), else "
                        "it sends several steps per chunk and a token looks cheaper than it is")
    p.add_argument("--repeat", type=int, default=3, help="runs per backend; the least CPU is reported")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--profile", action="store_true", help="also yappi's top functions (slows every call)")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def print_table(reports: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    groups = sorted({g for r in reports for g in r["us_per_token"]})
    t = Table(title="serving process CPU per output token (engine step excluded)")
    for c in ("backend", *(f"{g} µs/tok" for g in groups), "total µs/tok", "ms/step", "events/tok", "wall s"):
        t.add_column(c)
    for r in reports:
        t.add_row(r["backend"], *(f"{r['us_per_token'].get(g, 0.0):.1f}" for g in groups),
                  f"{r['parent_us_per_token']:.1f}", f"{r['parent_ms_per_step']:.2f}",
                  f"{r['stream_events_per_token']:.2f}", f"{r['wall_s']:.1f}")
    Console(width=200).print(t)
    for r in reports:
        for group, rows in (r["top_functions"] or {}).items():
            print(f"{r['backend']} / {group}: " + "; ".join(f"{name} {own:.2f}s" for name, own, _, _ in rows[:12]))


def main(argv=None) -> int:
    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    backends = ("thread", "process") if args.backend == "both" else (args.backend,)
    return save_runs(args, [measure(args, b) for b in backends], args.out / "server_cpu.json", print_table)


if __name__ == "__main__":
    sys.exit(main())
