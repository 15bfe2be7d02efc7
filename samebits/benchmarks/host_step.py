"""Host step benchmark: the engine's own CPU time per decode step, with no model in it.

    python -m samebits.benchmarks.host_step --out results/                  # batches 1, 64, 256; graph and eager inputs
    python -m samebits.benchmarks.host_step --batch 256 --profile --out /tmp/h   # + yappi's top functions

A real LLMEngine (async scheduling on, as on CUDA) over a tiny random model whose forward, logits and sampler are
stubs that cost next to nothing: the sampler draws each row's token from a fixed script of real text (English, code,
accents, CJK and emoji, so characters split across tokens) encoded by the default model's tokenizer
(SmolLM2-135M's GGUF, a real byte-level BPE). Everything else is the engine's: the scheduler and its block manager,
the runner's input building (the CUDA-graph path's `DecodeGraphs.fill`, which an H200 decode step takes, or the
eager path's `flatten` + `AttentionMetadata.build`), the read back, the output processor with detokenization and
stop rules, `outputs()` and `Scheduler.apply`. Time per phase is this thread's CPU time in those methods (so
another process on the machine counts little; "detokenize", called per sequence, is wall time), the stubs' own time
taken out. Each configuration warms up until every sequence decodes, then runs --repeat windows of
--steps steps; the table shows each phase's median window, in µs per step and per running sequence. After the run
every final text is checked against a full decode of its tokens, and a digest of every output (tokens, logprob bits,
text) is written, so a change to the engine can be shown to leave the outputs unchanged. Writes host_step.json.

Its runs (before and after the host-step work, per phase): docs/results/HISTORY.md, "Host step and server CPU".
"""
from __future__ import annotations

import argparse
import gc
import hashlib
import json
import statistics
import struct
import sys
import time
from pathlib import Path

import torch

from samebits.bench.report import save_runs
from samebits.engine.sampler import SamplerOutput

# Phases in step order; "detokenize" is part of "process", "other" is the step's time outside every phase, "gc" the
# cyclic garbage collector's passes, counted inside whichever phase allocated the object that triggered them.
PHASES = ("schedule", "inputs", "read back", "process", "detokenize", "outputs", "apply", "other", "step", "gc")
# What the stub sampler draws from, cycled: real text of several scripts, so tokens split UTF-8 characters.
SCRIPT = (
    "The capital of France is Paris. def fibonacci(n):\n    return n if n < 2 else fibonacci(n - 1) + fibonacci(n - 2)\n"
    "Les mathématiques sont la reine des sciences — ünïcödé ☃ 😀 🎉 naïve café. 東京は日本の首都です。"
    " Привет, мир! The quick brown fox jumps over the lazy dog; 1, 2, 3, 4, 5, 6, 7, 8, 9, 10. 🤖✨ "
)
VOCAB = 49152  # SmolLM2's
# Net new tracked objects before a young collection under --gc freeze+threshold (CPython's default is 700): a step
# at batch 256 allocates a few thousand that die with its outputs, so the default collects several times a step.
QUIET_GC_THRESHOLD = 50_000


def smollm2_tokenizer():
    from samebits.models import hub
    from samebits.models.gguf_file import read_gguf
    from samebits.models.loader_gguf import gguf_tokenizer

    meta, _ = read_gguf(hub.fetch("smollm2-135m"))
    return gguf_tokenizer(meta)


class Clock:
    """Seconds spent in each wrapped method, summed since the last reset. This thread's CPU time, so another process
    sharing the machine does not count; `wall` (perf_counter, ~10x cheaper to read) for a method called per sequence,
    where reading the CPU clock (a system call) would cost more than a fraction of the method."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def reset(self) -> None:
        self.seconds = {}

    def on_gc(self, phase: str, info: dict) -> None:
        """A gc.callbacks hook: the collector's own time, summed as "gc"."""
        if phase == "start":
            self._gc_start = time.thread_time()
        else:
            self.seconds["gc"] = self.seconds.get("gc", 0.0) + time.thread_time() - self._gc_start

    def wrap(self, name: str, fn, wall: bool = False):
        now = time.perf_counter if wall else time.thread_time

        def timed(*args, **kwargs):
            start = now()
            try:
                return fn(*args, **kwargs)
            finally:
                self.seconds[name] = self.seconds.get(name, 0.0) + now() - start

        return timed


class ScriptSampler:
    """The sampler's interface: row i's token is the script's token at (seed + position), logprobs are fixed."""

    def __init__(self, stream: list[int], max_rows: int, k: int):
        self.stream = stream
        self.logprobs = torch.full((max_rows,), -0.5)
        self.top_ids = torch.zeros((max_rows, k), dtype=torch.int64)
        self.top = torch.full((max_rows, k), -1.5)

    def __call__(self, logits, batch) -> SamplerOutput:
        n, stream = len(batch), self.stream
        ids = torch.tensor([stream[(s + p) % len(stream)] for s, p in zip(batch.seeds, batch.positions)])
        return SamplerOutput(ids, self.logprobs[:n], self.top_ids[:n, :batch.num_top_logprobs],
                             self.top[:n, :batch.num_top_logprobs])


class NoGraph:
    """A captured graph whose replay does nothing: the graph path's host work without a GPU."""

    def replay(self) -> None:
        pass


def build_engine(args, batch: int, inputs: str, tokenizer, stream: list[int], clock: Clock):
    from samebits.engine.config import EngineConfig
    from samebits.engine.llm_engine import LLMEngine
    from samebits.models.loader import LoadedModel
    from samebits.models.synthetic import random_loaded

    max_model_len = args.prompt_len + max_tokens(args) + 16
    tiny = random_loaded({"vocab_size": VOCAB, "max_position_embeddings": max_model_len}, "host-step", "fast", "cpu")
    loaded = LoadedModel(tiny.model, tokenizer, tiny.config, tiny.name, tiny.path)
    config = EngineConfig(model="host-step", mode="fast", device="cpu", async_scheduling=True, cuda_graphs=False,
                          max_num_seqs=batch, max_model_len=max_model_len,
                          kv_cache_tokens=batch * (max_model_len + 16))
    engine = LLMEngine(config, loaded)
    stub_model(engine, inputs, max(batch, 8), clock)
    engine.runner.sampler = clock.wrap("stub", ScriptSampler(stream, batch, max(args.logprobs, 0)))
    instrument(engine, clock)
    return engine


def stub_model(engine, inputs: str, rows: int, clock: Clock) -> None:
    """The model's forward and logits as stubs; with graph inputs, every graph a NoGraph, captured at no cost."""
    model, runner = engine.runner.model, engine.runner
    hidden = torch.zeros(max(rows, engine.config.max_num_batched_tokens), model.config.hidden_size)
    model.forward = clock.wrap("stub", lambda ids, *_: hidden[:ids.shape[0]])
    model.compute_logits = clock.wrap("stub", lambda h: h[:, :1])
    if inputs == "graph":
        from samebits.engine.cuda_graphs import DecodeGraphs

        runner.graphs = DecodeGraphs(model, runner.kv_caches, runner.block_size, runner.scratch_block,
                                     engine.max_model_len, engine.config.max_num_seqs)
        replay = NoGraph()
        replay.replay = clock.wrap("stub", replay.replay)
        graphs = runner.graphs.graphs
        runner.graphs.capture = lambda key: graphs.__setitem__(key, (replay, hidden[:key[0]]))


def instrument(engine, clock: Clock) -> None:
    sched, proc, runner = engine.scheduler, engine.processor, engine.runner
    sched.schedule = clock.wrap("schedule", sched.schedule)
    sched.apply = clock.wrap("apply", sched.apply)
    proc.process = clock.wrap("process", proc.process)
    proc._detokenize = clock.wrap("detokenize", proc._detokenize, wall=True)
    proc.outputs = clock.wrap("outputs", proc.outputs)
    execute = clock.wrap("execute", runner.execute)

    def timed_execute(*args, **kwargs):
        sampled = execute(*args, **kwargs)
        sampled.to_host = clock.wrap("read back", sampled.to_host)
        return sampled

    runner.execute = timed_execute
    engine.step = clock.wrap("engine step", engine.step)


def max_tokens(args) -> int:
    return args.warmup + args.repeat * args.steps + 8


def add_requests(engine, args, batch: int, stream: list[int]) -> None:
    from samebits.engine.sampling_params import SamplingParams

    for i in range(batch):
        at = (i * 37) % len(stream)
        prompt = (stream[at:] + stream)[:args.prompt_len]
        params = SamplingParams(temperature=0.7, seed=i * 101, max_tokens=max_tokens(args), ignore_eos=True,
                                logprobs=None if args.logprobs < 0 else args.logprobs, stop=args.stop or None)
        engine.add_request(f"r{i}", prompt, params)


def phase_us(seconds: dict[str, float], steps: int) -> dict[str, float]:
    """µs per step of each phase, the stubs' time taken out of the step and of the runner's execute."""
    us = {k: 1e6 * v / steps for k, v in seconds.items()}
    out = {p: us.get(p, 0.0) for p in PHASES if p not in ("inputs", "other", "step")}
    out["inputs"] = us.get("execute", 0.0) - us.get("stub", 0.0)
    out["step"] = us.get("engine step", 0.0) - us.get("stub", 0.0)
    out["other"] = out["step"] - sum(out[p] for p in ("schedule", "inputs", "read back", "process", "outputs", "apply"))
    out["stub"] = us.get("stub", 0.0)
    return out


def measure(args, batch: int, inputs: str, tokenizer, stream: list[int], advance) -> dict:
    clock = Clock()
    engine = build_engine(args, batch, inputs, tokenizer, stream, clock)
    add_requests(engine, args, batch, stream)
    finals: dict[str, object] = {}
    while engine.scheduler.waiting or any(s.in_prefill for s in engine.scheduler.running):
        keep_finals(engine.step(), finals)
    for _ in range(args.warmup):
        keep_finals(engine.step(), finals)
    gc.collect()  # the previous configuration's engine goes now, not in some window of this one
    windows, profile = [], start_profile() if args.profile else None
    thresholds = gc.get_threshold()
    if args.gc != "default":  # what a server could do once loaded: the collector never scans the startup heap again
        gc.freeze()
    if args.gc == "freeze+threshold":  # and a step's short-lived outputs are freed before a young collection scans them
        gc.set_threshold(QUIET_GC_THRESHOLD, *thresholds[1:])
    gc.callbacks.append(clock.on_gc)
    try:
        for _ in range(args.repeat):
            clock.reset()
            for _ in range(args.steps):
                keep_finals(engine.step(), finals)
            windows.append(phase_us(clock.seconds, args.steps))
            advance()
    finally:
        gc.callbacks.remove(clock.on_gc)
        gc.unfreeze()
        gc.set_threshold(*thresholds)
    top = stop_profile(profile) if profile else None
    context = statistics.mean([s.num_tokens for s in engine.scheduler.running] or [0])  # a stop string ends some
    while engine.has_unfinished_requests():
        keep_finals(engine.step(), finals)
    us = {p: statistics.median(w[p] for w in windows) for p in (*PHASES, "stub")}
    return {"batch": batch, "inputs": inputs, "us_per_step": us, "us_per_seq": {p: v / batch for p, v in us.items()},
            "windows": windows, "mean_context_len_at_end": context, "outputs_digest": check_outputs(finals, tokenizer),
            "top_functions": top}


def keep_finals(outputs, finals: dict) -> None:
    for out in outputs:
        if out.finished:
            finals[out.request_id] = out


def check_outputs(finals: dict, tokenizer) -> str:
    """Raise unless every final text is the full decode of its tokens (its start, where a stop string cut it); the
    digest of every output's bits."""
    h = hashlib.sha256()
    for rid in sorted(finals):
        for c in finals[rid].outputs:
            full = tokenizer.decode(c.token_ids)
            if c.text != full and not (isinstance(c.stop_reason, str) and full.startswith(c.text)):
                raise AssertionError(f"{rid}: the incremental text differs from the full decode")
            lps = c.token_logprobs or []
            h.update(json.dumps([rid, c.token_ids, c.text, c.finish_reason]).encode())
            h.update(struct.pack(f"<{len(lps)}f", *lps))
    return h.hexdigest()


def start_profile():
    import yappi

    yappi.set_clock_type("cpu")
    yappi.clear_stats()
    yappi.start()
    return yappi


def stop_profile(yappi, limit: int = 25) -> list:
    """The functions with the most own CPU (tsub): (name, own s, total s, calls)."""
    yappi.stop()
    stats = sorted(yappi.get_func_stats(), key=lambda f: -f.tsub)[:limit]
    yappi.clear_stats()
    return [(f"{f.module.rsplit('/', 1)[-1]}:{f.lineno} {f.name}", f.tsub, f.ttot, f.ncall) for f in stats]


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--batch", type=int, nargs="+", default=[1, 64, 256], help="running sequences")
    p.add_argument("--inputs", choices=("graph", "eager"), nargs="+", default=["graph", "eager"],
                   help="the runner's input path: graph (DecodeGraphs.fill, a CUDA decode step) or eager (flatten)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--warmup", type=int, default=32, help="decode steps before the first window")
    p.add_argument("--steps", type=int, default=64, help="steps per window")
    p.add_argument("--repeat", type=int, default=7, help="windows per configuration; the median is reported")
    p.add_argument("--logprobs", type=int, default=0, help="logprobs per request (-1: none), as server.py")
    p.add_argument("--stop", action="append",
                   help="a stop string every request carries (repeatable); a sample it stops leaves the batch, "
                        "while µs per sequence still divides by --batch")
    p.add_argument("--gc", choices=("default", "freeze", "freeze+threshold"), default="default",
                   help="freeze: gc.freeze() before the measured steps (the startup heap leaves the collector's scans); "
                        f"+threshold: also a young-generation threshold of {QUIET_GC_THRESHOLD} allocations")
    p.add_argument("--profile", action="store_true", help="also yappi's top functions (slows every call)")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def print_table(runs: list[dict]) -> None:
    from rich.console import Console
    from rich.table import Table

    t = Table(title="engine host time per decode step, µs per step (µs per running sequence); median window")
    for c in ("batch", "inputs", *PHASES):
        t.add_column(c, justify="right")
    for r in runs:
        t.add_row(str(r["batch"]), r["inputs"],
                  *(f"{r['us_per_step'][p]:.0f} ({r['us_per_seq'][p]:.2f})" for p in PHASES))
    Console(width=220).print(t)
    for r in runs:
        if r["top_functions"]:
            print(f"batch {r['batch']} / {r['inputs']}: " +
                  "; ".join(f"{name} {own:.3f}s" for name, own, _, _ in r["top_functions"][:15]))


def main(argv=None) -> int:
    from samebits.progress import progress_bar

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    tokenizer = smollm2_tokenizer()
    stream = tokenizer.encode(SCRIPT, add_special_tokens=False)
    configs = [(b, i) for b in args.batch for i in args.inputs]
    with progress_bar() as bar:
        task = bar.add_task("host step", total=len(configs) * args.repeat)
        runs = [measure(args, b, i, tokenizer, stream, lambda: bar.advance(task)) for b, i in configs]
    return save_runs(args, runs, args.out / "host_step.json", print_table)


# samebits: intentionally nondeterministic because a benchmark times stock torch and fast mode beside deterministic
# mode, and each mode enters its own runtime (runtime/template.py) where it runs.
if __name__ == "__main__":
    sys.exit(main())
