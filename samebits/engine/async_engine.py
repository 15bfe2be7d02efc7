"""AsyncEngine: the synchronous `LLMEngine` step loop in one thread, beside an asyncio event loop.

Only the engine thread touches the engine (it is not thread-safe): the event loop sends it commands (add, abort)
through a deque and a wake-up event, and the thread sends back outputs with `call_soon_threadsafe`. Outputs are
cumulative, so each request keeps only its latest one: a slow reader skips intermediate steps, never tokens.

Relies on `LLMEngine.step()` returning fresh RequestOutputs whose lists (or read-only views, while a request runs)
never change afterwards, so they cross threads without a copy. Tokens and latencies are counted from `LLMEngine.progress()`, which
covers every request a step advanced: a non-streamed request asks the engine for its final output only
(RequestOutputKind.FINAL_ONLY), so none is built for it at the steps between.
"""
from __future__ import annotations

import asyncio
import collections
import concurrent.futures
import dataclasses
import threading
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from typing import Any

from samebits.engine.outputs import EngineStats, StepProgress
from samebits.engine.sampling_params import RequestOutputKind
from samebits.engine.scheduler import QueueFull
from samebits.errors import FieldError

__all__ = ["ENGINE_COMMANDS", "AsyncEngine", "EngineDead", "QueueFull", "RequestTooLarge", "engine_command"]

# What the server runs on the engine between steps, by name: a name crosses to an engine process, a closure cannot.
ENGINE_COMMANDS = ("update_weights", "restore_weights", "forget_previous_weights")


class EngineDead(RuntimeError):
    """The engine loop thread has stopped; no request can be served."""


class RequestTooLarge(FieldError):
    """The request alone exceeds the waiting limits: it could never be admitted, so retrying is no use (a 400)."""


@dataclass
class Counters:
    """Monotonic counters kept on the event loop (read them from there)."""

    prompt_tokens: int = 0
    generation_tokens: int = 0
    requests_added: int = 0
    requests_finished: int = 0
    requests_aborted: int = 0
    requests_rejected: int = 0


class _Stream:
    """One request's mailbox on the event loop: the latest cumulative output, an error, or closed."""

    def __init__(self, final_only: bool, seqs: int, tokens: int) -> None:
        self.seqs = seqs  # what it counts against the waiting limits until its first output
        self.tokens = tokens
        self.latest: Any = None
        self.error: BaseException | None = None
        self.closed = False
        self.final_only = final_only
        self.arrival = time.monotonic()
        self.first_output: float | None = None  # time.monotonic() when its first and its latest output arrived
        self.last_output: float | None = None
        self.event = asyncio.Event()

    @property
    def started(self) -> bool:
        return self.first_output is not None

    def put(self, out) -> None:
        self.latest = out
        self.event.set()

    def fail(self, error: BaseException) -> None:
        self.error = error
        self.event.set()

    def close(self) -> None:
        self.closed = True
        self.event.set()

    async def next(self):
        while True:
            if self.latest is not None:
                out, self.latest = self.latest, None
                return out
            if self.error is not None:
                raise self.error
            if self.closed:
                return None
            self.event.clear()
            await self.event.wait()


def _call(hook: Callable[[float], None] | None, value: float) -> None:
    if hook is not None:
        hook(value)


def _settle(future: concurrent.futures.Future, error: BaseException | None = None, result: Any = None) -> None:
    """Complete a command's future unless its waiter already gave up (asyncio cancels wrapped futures)."""
    try:
        if error is None:
            future.set_result(result)
        else:
            future.set_exception(error)
    except concurrent.futures.InvalidStateError:
        pass


def engine_command(name: str) -> Callable:
    """The function `fn(engine, *args)` named `name` in ENGINE_COMMANDS; ValueError naming the known ones."""
    if name not in ENGINE_COMMANDS:
        raise ValueError(f"unknown engine command {name!r}; the engine runs {list(ENGINE_COMMANDS)}")
    from samebits.engine import weights

    return getattr(weights, name)


def waiting_cost(num_prompt_tokens: int, params) -> tuple[int, int]:
    """(sequences, tokens) one engine request counts while it waits: n samples, each its prompt plus max_tokens."""
    return params.n, params.n * (num_prompt_tokens + params.max_tokens)


def check_request_size(seqs: int, tokens: int, max_waiting: int, max_waiting_tokens: int | None,
                       where: str = "") -> None:
    """RequestTooLarge naming the field when one request is more than a queue of these limits could ever hold
    (`where`: " per replica" for the fleet, whose limits are one replica's)."""
    if seqs > max_waiting:
        raise RequestTooLarge("n", f"n: the request is {seqs} sequences (prompts x n); this server queues at most "
                              f"{max_waiting}{where} (max_waiting)")
    if max_waiting_tokens is not None and tokens > max_waiting_tokens:
        raise RequestTooLarge("max_tokens",
                              f"max_tokens: the request holds {tokens} tokens (prompt + max_tokens, per "
                              f"sequence); this server queues at most {max_waiting_tokens}{where} (max_waiting_tokens)")


class AsyncEngine:
    def __init__(self, engine, max_waiting: int = 1024, idle_poll_s: float = 0.5,
                 max_waiting_tokens: int | None = None):
        self.engine = engine
        self.max_waiting = max_waiting  # sequences (prompts x n)
        self.max_waiting_tokens = max_waiting_tokens
        self.counters = Counters()
        # Latency hooks (seconds since admission), called on the event loop: the server's histograms.
        self.on_first_output: Callable[[float], None] | None = None
        self.on_finished: Callable[[float], None] | None = None
        # on_step(now, entries): once per engine step, on the event loop, for the per-token series; an entry is
        # (its StepProgress, its output or None when none was due, its stream, seconds since the stream's last
        # progress or None if this is its first).
        self.on_step: Callable[[float, list[tuple[StepProgress, Any, _Stream, float | None]]], None] | None = None
        # on_dead(error): once, on the event loop, when the engine loop dies (not on shutdown): the server's
        # supervisor (server/supervisor.py). Every waiter has been failed with EngineDead by then.
        self.on_dead: Callable[[BaseException], None] | None = None
        self.stats: EngineStats | None = None
        self._idle_poll_s = idle_poll_s
        self._commands: collections.deque = collections.deque()
        self._wake = threading.Event()
        self._streams: dict[str, _Stream] = {}
        self._loop: asyncio.AbstractEventLoop | None = None
        self._thread: threading.Thread | None = None
        self._stopping = False
        self.error: BaseException | None = None
        self._refresh_stats()

    # ---- lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        """Bind to the running event loop and start the engine thread (idempotent)."""
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._thread = threading.Thread(target=self._run, name="samebits-engine", daemon=True)
        self._thread.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        self._wake.set()
        if self._thread is not None:
            self._thread.join(timeout)

    @property
    def healthy(self) -> bool:
        alive = self._thread is None or self._thread.is_alive()
        return alive and self.error is None and not self._stopping

    def health(self) -> dict:
        """What /health adds to its status: nothing for one engine (a fleet lists its replicas, fleet/engine.py)."""
        return {}

    @property
    def num_waiting(self) -> int:
        """Requests admitted here that have not produced their first output yet."""
        return sum(not s.started for s in self._streams.values())

    @property
    def num_running(self) -> int:
        return sum(s.started for s in self._streams.values())

    @property
    def waiting_cost(self) -> tuple[int, int]:
        """(sequences, tokens) of the requests that have not produced their first output yet."""
        waiting = [s for s in self._streams.values() if not s.started]
        return sum(s.seqs for s in waiting), sum(s.tokens for s in waiting)

    def check_admission(self, seqs: int, tokens: int) -> None:
        """Raise RequestTooLarge if work of this size could never wait here, QueueFull if it cannot now."""
        check_request_size(seqs, tokens, self.max_waiting, self.max_waiting_tokens)
        token_limit = self.max_waiting_tokens
        waiting_seqs, waiting_tokens = self.waiting_cost
        if waiting_seqs + seqs > self.max_waiting or (token_limit is not None and waiting_tokens + tokens > token_limit):
            self.counters.requests_rejected += 1
            raise QueueFull(self.max_waiting)

    # ---- event-loop side -------------------------------------------------------------------------------------------
    async def generate(self, request_id: str, prompt_token_ids: list[int], params, prompt: str | None = None, *,
                       final_only: bool = False, resume=None) -> AsyncIterator:
        """Yield the request's cumulative RequestOutput as it progresses; the last has `finished` set.
        `final_only` yields just that last one (a non-streamed response): the engine builds no other. `resume`: the
        samples as another engine sent them (LLMEngine.add_request).

        Raises ValueError (from the engine, naming the field) before the first output, QueueFull, or EngineDead.
        Closing the iterator early aborts the request and frees its KV blocks.
        """
        stream = self._admit(request_id, final_only, *waiting_cost(len(prompt_token_ids), params))
        if final_only:
            params = dataclasses.replace(params, output_kind=RequestOutputKind.FINAL_ONLY)
        added = finished = False
        try:
            await asyncio.wrap_future(self._submit("add", request_id, list(prompt_token_ids), params, prompt,
                                                   resume))
            added = True
            self.counters.prompt_tokens += len(prompt_token_ids)
            self.counters.requests_added += 1
            while (out := await stream.next()) is not None:
                finished = bool(out.finished)
                yield out
                if finished:
                    return
        finally:
            self._streams.pop(request_id, None)
            if not finished:
                # Also when the add is still queued: the engine thread applies commands in order, add then abort.
                self.counters.requests_aborted += added
                self._submit("abort", request_id)

    def _admit(self, request_id: str, final_only: bool, seqs: int, tokens: int) -> _Stream:
        if not self.healthy:
            raise EngineDead("the engine loop has stopped") from self.error
        if request_id in self._streams:
            raise FieldError("request_id", f"request_id {request_id!r} is already in use")
        self.check_admission(seqs, tokens)
        self.start()
        stream = self._streams[request_id] = _Stream(final_only, seqs, tokens)
        return stream

    async def abort(self, request_id: str) -> None:
        """Abort a request; when this returns the engine has released its KV blocks."""
        stream = self._streams.get(request_id)
        if stream is not None:
            stream.close()
        await asyncio.wrap_future(self._submit("abort", request_id))

    async def call(self, fn: Callable[[Any], Any]) -> Any:
        """fn(engine) on the engine thread, between steps (the engine is not thread-safe): its result or its error."""
        return await asyncio.wrap_future(self._submit("call", fn))

    async def command(self, name: str, *args) -> Any:
        """The named engine command (ENGINE_COMMANDS) on the engine between steps: its result or its error."""
        fn = engine_command(name)
        return await self.call(lambda engine: fn(engine, *args))

    def _submit(self, kind: str, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        if not self.healthy:  # no thread will apply it: answer now rather than leave the waiter hanging
            _settle(future, EngineDead("the engine loop has stopped") if kind != "abort" else None)
            return future
        self._commands.append((kind, args, future))
        self._wake.set()
        return future

    def _dispatch(self, outputs: list, progress: list[StepProgress]) -> None:
        """One step's outputs, a subsequence of its progress in the same order (LLMEngine.progress)."""
        now = time.monotonic()  # one clock read for the step: every output of it reached the loop together
        entries = []
        due = iter(outputs)
        out = next(due, None)
        for step in progress:
            mine = out if out is not None and out.request_id == step.request_id else None
            if mine is not None:
                out = next(due, None)
            stream = self._streams.get(step.request_id)
            if stream is None:
                continue
            entries.append(self._count(stream, step, mine, now))
            if mine is not None and (mine.finished or not stream.final_only):
                stream.put(mine)
        if entries and self.on_step is not None:
            self.on_step(now, entries)

    def _count(self, stream: _Stream, step: StepProgress, out, now: float) -> tuple:
        self.counters.generation_tokens += step.new_tokens
        gap = None if stream.last_output is None else now - stream.last_output
        stream.last_output = now
        if stream.first_output is None:
            stream.first_output = now
            _call(self.on_first_output, now - stream.arrival)
        if out is not None and out.finished:
            self.counters.requests_finished += 1
            _call(self.on_finished, now - stream.arrival)
        return step, out, stream, gap

    def _fail_all(self, error: BaseException) -> None:
        dead = EngineDead(f"the engine loop has stopped: {type(error).__name__}: {error}")
        for stream in self._streams.values():
            stream.fail(dead)

    # ---- engine-thread side ----------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping:
                self._wake.clear()
                busy = self._apply_commands()
                if busy:  # an abort's freed blocks show in the gauges now, not after the next (maybe long) step
                    self._refresh_stats()
                if self.engine.has_unfinished_requests():
                    self._step()
                elif not busy:
                    self._wake.wait(self._idle_poll_s)
        except BaseException as e:  # noqa: BLE001 - the loop is dead either way; every waiter must hear why
            self.error = e
            self._post(self._fail_all, e)
        finally:
            self._fail_pending_commands()
            # Also on a clean shutdown: a request still waiting must hear that no output will come.
            self._post(self._fail_all, self.error or RuntimeError("the engine was shut down"))
            self._post_death()

    def _step(self) -> None:
        outputs = self.engine.step()
        progress = self.engine.progress()
        self._refresh_stats()
        if progress:
            self._post(self._dispatch, outputs, progress)

    def _apply_commands(self) -> bool:
        applied = False
        while self._commands:
            kind, args, future = self._commands.popleft()
            self._apply(kind, args, future)
            applied = True
        return applied

    def _apply(self, kind: str, args: tuple, future: concurrent.futures.Future) -> None:
        # Applied even when the waiter was cancelled: an add must still be matched by the abort that follows it.
        result = None
        try:
            if kind == "add":
                request_id, ids, params, prompt, resume = args
                self.engine.add_request(request_id, ids, params, prompt=prompt, resume=resume)
            elif kind == "call":
                result = args[0](self.engine)
            else:
                self.engine.abort_request(args[0])
        # A bad request (or an unknown id to abort, or a failed call) fails that command, never the loop.
        except Exception as e:  # noqa: BLE001
            if kind != "abort":
                _settle(future, error=e)
                return
        _settle(future, result=result)

    def _fail_pending_commands(self) -> None:
        while self._commands:
            _, _, future = self._commands.popleft()
            _settle(future, error=EngineDead("the engine loop has stopped"))

    def _post_death(self) -> None:
        if self.error is not None:
            self._post(self._report_death, self.error)

    def _report_death(self, error: BaseException) -> None:
        if self.on_dead is not None:
            self.on_dead(error)

    def _refresh_stats(self) -> None:
        self.stats = self.engine.stats()

    def _post(self, fn, *args) -> None:
        loop = self._loop
        if loop is not None and not loop.is_closed():
            loop.call_soon_threadsafe(fn, *args)
