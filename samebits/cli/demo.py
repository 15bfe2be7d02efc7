"""`samebits demo`: the main job. The same 16 prompts alone and inside a busy mixed batch, in fast and deterministic
mode, on the built-in model; a table of which prompts changed their tokens or logprob bits, and what it cost.

Each mode runs in a fresh process, as a user would start it: fast mode with the vendor libraries as they come,
deterministic mode with the deployment template entered before anything computes (MKL's reproducible mode, like
cuBLAS's workspace, can only be set before the library's first call)."""
from __future__ import annotations

import contextlib
import json
import multiprocessing
import queue as queue_module
import random
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from samebits.engine.config import EngineConfig
from samebits.engine.sampling_params import SamplingParams

QUESTIONS = [
    "What is the capital of France?", "Name three primary colors.", "What is 12 times 7?",
    "Give me a synonym for happy.", "What does a bee make?", "Translate 'thank you' to Spanish.",
    "What planet is known as the red planet?", "How many legs does a spider have?",
    "What is the boiling point of water in Celsius?", "Write a haiku about rain.",
    "Who wrote Romeo and Juliet?", "What gas do plants absorb?", "What is the largest ocean?",
    "Spell the word 'necessary' backwards.", "What is the square root of 81?", "Name a famous painting.",
]
FILLERS = 48
MAX_TOKENS = 12


@dataclass
class ModeResult:
    mode: str
    alone: list = field(default_factory=list)
    busy: list = field(default_factory=list)
    texts: list = field(default_factory=list)
    seconds: float = 0.0

    def differs(self) -> list[dict]:
        return [{"tokens": a[0] != b[0], "logprob_bits": a[1] != b[1]} for a, b in zip(self.alone, self.busy)]


def _key(out) -> tuple:
    c = out.outputs[0]
    return tuple(c.token_ids), tuple(torch.tensor(c.token_logprobs, dtype=torch.float32).view(torch.int32).tolist())


def _filler_prompts(tokenizer, n: int, seed: int = 0) -> list[list[int]]:
    rng = random.Random(seed)
    words = tokenizer.encode(" ".join(QUESTIONS))
    return [[rng.choice(words) for _ in range(rng.randint(8, 300))] for _ in range(n)]


def _busy_batch(prompts: list, fillers: list, seed: int = 1) -> tuple[list, list[int]]:
    """The 16 prompts scattered at random positions among the fillers; returns the batch and their positions."""
    rng = random.Random(seed)
    batch = list(fillers)
    for p in prompts:
        batch.insert(rng.randrange(len(batch) + 1), p)
    ids = [id(p) for p in prompts]
    return batch, [next(i for i, q in enumerate(batch) if id(q) == pid) for pid in ids]


def _engine(loaded, mode: str, device: str):
    from samebits.engine.llm_engine import LLMEngine
    from samebits.kernels import get_ops

    loaded.model.set_ops(get_ops(mode, device))
    config = EngineConfig(model=str(loaded.path), mode=mode, device=device, kv_cache_tokens=16384,
                          max_num_batched_tokens=512)
    return LLMEngine(config, loaded)


def _generate(engine, prompts: list, params: SamplingParams) -> list:
    ids = [f"demo-{i}-{time.monotonic_ns()}" for i in range(len(prompts))]
    for rid, p in zip(ids, prompts):
        engine.add_request(rid, p, params)
    done = {}
    while engine.has_unfinished_requests():
        done.update({o.request_id: o for o in engine.step() if o.finished})
    return [done[i] for i in ids]


def run_mode(loaded, mode: str, device: str, prompts, fillers, progress) -> ModeResult:
    from samebits.runtime import deterministic_runtime

    params = SamplingParams(temperature=0.0, max_tokens=MAX_TOKENS, logprobs=0)
    result = ModeResult(mode)
    task = progress.add_task(f"{mode}: alone", total=len(prompts) + 1)
    ctx = deterministic_runtime() if mode == "deterministic" else contextlib.nullcontext()
    with ctx:
        engine = _engine(loaded, mode, device)
        start = time.perf_counter()
        for p in prompts:
            out = _generate(engine, [p], params)[0]
            result.alone.append(_key(out))
            result.texts.append(out.outputs[0].text)
            progress.advance(task)
        progress.update(task, description=f"{mode}: busy batch of {len(prompts) + len(fillers)}")
        batch, where = _busy_batch(prompts, fillers)
        outs = _generate(engine, batch, params)
        result.busy = [_key(outs[i]) for i in where]
        result.seconds = time.perf_counter() - start
        progress.advance(task)
    return result


def _cell(diff: dict) -> str:
    if diff["tokens"]:
        return "[red]tokens differ[/]"
    return "[yellow]bits differ[/]" if diff["logprob_bits"] else "[green]same[/]"


def _table(results: list[ModeResult]) -> Table:
    table = Table(title="alone vs inside a busy batch: does the output change?")
    table.add_column("prompt", max_width=21, no_wrap=True, overflow="ellipsis")
    table.add_column("answer", max_width=17, no_wrap=True, overflow="ellipsis")
    for r in results:
        table.add_column(r.mode, min_width=13, no_wrap=True)
    diffs = [r.differs() for r in results]
    for i, q in enumerate(QUESTIONS):
        table.add_row(q, " ".join(results[-1].texts[i].split()), *[_cell(d[i]) for d in diffs])
    return table


def _summary(results: list[ModeResult]) -> dict:
    return {r.mode: {"prompts_with_token_diffs": sum(d["tokens"] for d in r.differs()),
                     "prompts_with_logprob_bit_diffs": sum(d["logprob_bits"] for d in r.differs()),
                     "seconds": round(r.seconds, 2)} for r in results}


class _ProgressToQueue:
    """The part of rich's Progress that run_mode uses, sent to the parent process as events."""

    def __init__(self, queue):
        self.queue = queue

    def add_task(self, description: str, total: int) -> int:
        self.queue.put(("add", description, total))
        return 0

    def advance(self, task: int) -> None:
        self.queue.put(("advance",))

    def update(self, task: int, description: str) -> None:
        self.queue.put(("update", description))


def _mode_process(model: str, mode: str, device: str, queue) -> None:
    """One mode in a fresh process: in deterministic mode the template is entered before the model loads."""
    from samebits.models import load_model
    from samebits.runtime import deterministic_runtime, fingerprint

    try:
        with deterministic_runtime() if mode == "deterministic" else contextlib.nullcontext():
            loaded = load_model(model, mode, device, progress=False)  # the parent's bar counts this process's work
            prompts = [loaded.tokenizer.encode_chat([{"role": "user", "content": q}]) for q in QUESTIONS]
            result = run_mode(loaded, mode, device, prompts, _filler_prompts(loaded.tokenizer, FILLERS),
                              _ProgressToQueue(queue))
            queue.put(("done", asdict(result), fingerprint(mode)))
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        queue.put(("error", str(e)))


def _run_in_fresh_process(model: str, mode: str, device: str, progress: Progress) -> tuple[ModeResult, dict]:
    ctx = multiprocessing.get_context("spawn")
    queue = ctx.Queue()
    proc = ctx.Process(target=_mode_process, args=(model, mode, device, queue), daemon=True)
    proc.start()
    task = None
    try:
        while True:
            try:
                event = queue.get(timeout=1.0)
            except queue_module.Empty:
                if proc.exitcode is not None:
                    raise RuntimeError(f"demo: the {mode} process exited with code {proc.exitcode}") from None
                continue
            if event[0] == "add":
                task = progress.add_task(event[1], total=event[2])
            elif event[0] == "advance":
                progress.advance(task)
            elif event[0] == "update":
                progress.update(task, description=event[1])
            elif event[0] == "done":
                return ModeResult(**event[1]), event[2]
            else:
                raise RuntimeError(event[1])
    finally:
        proc.join(timeout=30)


def demo_command(model: str, device: str | None, json_path: Path | None, fail) -> None:
    from samebits.models import hub
    from samebits.models.loader import default_device, resolve_device
    from samebits.progress import progress_bar

    console = Console()
    device = device or default_device()
    try:
        resolve_device(device)  # here, not in the two mode processes, whose tracebacks would drown it
    except ValueError as e:
        fail(str(e))
    if model in hub.BUILTIN:
        hub.fetch(model)  # once, here, so the two mode processes never download it side by side
    results, fps = [], {}
    try:
        with progress_bar() as progress:
            for mode in ("fast", "deterministic"):
                result, fps[mode] = _run_in_fresh_process(model, mode, device, progress)
                results.append(result)
    except RuntimeError as e:
        fail(str(e))
    _report(console, results, fps["deterministic"], json_path, fail)


def _report(console: Console, results: list[ModeResult], fp: dict, json_path: Path | None, fail) -> None:
    console.print(_table(results))
    summary = _summary(results)
    for mode, s in summary.items():
        console.print(f"{mode}: {s['prompts_with_token_diffs']}/16 prompts changed tokens, "
                      f"{s['prompts_with_logprob_bit_diffs']}/16 changed logprob bits, {s['seconds']:.1f} s")
    where = fp["gpu"]["name"] if fp["gpu"] else f"{fp['cpu']}, MKL {fp['mkl_cnr']}, {fp['cpu_threads']} threads"
    console.print(f"deterministic fingerprint {fp['hash']}  (torch {fp['torch']}, cuBLAS {fp['cublas']}, {where})")
    if json_path is not None:
        try:
            json_path.write_text(json.dumps({"summary": summary, "fingerprint": fp,
                                             "rows": [r.differs() for r in results]}, indent=2))
        except OSError as e:
            fail(f"cannot write {json_path}: {e.strerror}")


def generate_command(prompts: list[str], model: str, mode: str, max_tokens: int, temperature: float,
                     seed: int | None, chat: bool, device: str | None, fail) -> None:
    from samebits.engine.llm import LLM

    console = Console()
    try:
        params = SamplingParams(temperature=temperature, max_tokens=max_tokens, seed=seed, logprobs=0)
        llm = LLM(model=model, mode=mode, device=device)
    except (FileNotFoundError, ValueError, RuntimeError) as e:
        fail(str(e))
    if chat:
        outs = llm.chat([[{"role": "user", "content": p}] for p in prompts], params, use_tqdm=False)
    else:
        outs = llm.generate(prompts, params, use_tqdm=False)
    for p, o in zip(prompts, outs):
        c = o.outputs[0]
        console.print(f"[bold]{p}[/]\n{c.text}\n[dim]seed {o.seed}, {len(c.token_ids)} tokens, "
                      f"logprob {c.cumulative_logprob:.4f}, finish {c.finish_reason}[/]")
