"""ProcessAsyncEngine: AsyncEngine with the LLMEngine in a child process, so the server's Python work (HTTP, SSE,
JSON, metrics) never holds the GIL the step needs (`--engine-process`).

The event-loop side is AsyncEngine's, unchanged. Of its engine thread two threads remain here, doing almost no
Python work: a sender that writes the commands (add, abort, named commands) down one pipe, and a receiver that reads
each step's output deltas, progress and stats (output_deltas.py) and posts the rebuilt outputs to the event loop. The child
applies the commands in order between steps, as the engine thread does, and answers each. The pipes join the
server's own two processes only; nothing a client sends is unpickled there.

The server reads the engine through `EngineView`: the tokenizer, the limits and `validate`, as the engine's (one
function, sampling_params.check_prompt), and the seed stream. The server draws every seed a request does not send
before queueing it, so the stream lives here: the same `--seed` draws the same seeds as the thread backend.

A child that dies (an exception, a signal) fails every waiter with EngineDead, its reason included, and `restart()`
starts another in its place (the server's supervisor decides when: server/supervisor.py); one that dies while
loading fails the constructor. The child ignores Ctrl-C (the server's to handle) and ends with its pipe.
"""
from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import gc
import itertools
import multiprocessing
import multiprocessing.connection
import pickle
import signal
import threading
import time
import traceback
from collections.abc import Callable
from typing import Any

from samebits.engine.async_engine import AsyncEngine, EngineDead, _settle, engine_command
from samebits.engine.config import EngineConfig
from samebits.engine.output_deltas import DeltaDecoder, DeltaEncoder
from samebits.engine.sampling_params import check_prompt
from samebits.engine.seeds import SeedStream
from samebits.runtime.fingerprint import diff_fingerprints

START_TIMEOUT_S = 1800.0  # an 8B model's random weights, route proofs and graph captures take minutes, not this
STOP_TIMEOUT_S = 10.0


class EngineProcessError(RuntimeError):
    """The engine process failed or exited; the message says how."""


class IdentityChanged(EngineProcessError):
    """A restarted engine process has another fingerprint than the one it replaces; it cannot serve in its place."""

    def __init__(self, fields: list[tuple[str, object, object]]):
        self.fields = [name for name, _, _ in fields]
        shown = "; ".join(f"{name}: served {ours!r}, restarted {theirs!r}" for name, ours, theirs in fields)
        super().__init__(f"the restarted engine process has another numerics identity, so it would answer with other "
                         f"bits; differing fields: {shown}")


class EngineView:
    """EngineFacts (engine/interface.py), what the server reads from `state.engine`, without the engine: it is in the
    child."""

    def __init__(self, config: EngineConfig, info, tokenizer, fingerprint: dict, stats):
        self.config, self.tokenizer = config, tokenizer
        self.model_name, self.vocab_size, self.max_model_len = info.model_name, info.vocab_size, info.max_model_len
        self._info, self._fingerprint, self._stats = info, fingerprint, stats
        self._seeds = SeedStream(config.seed)

    def info(self):
        return self._info

    def fingerprint(self) -> dict:
        return self._fingerprint

    def stats(self):
        return self._stats

    def draw_seed(self) -> int:
        return self._seeds.draw()

    def validate(self, prompt_token_ids: list[int], params, where: str = "prompt") -> None:
        check_prompt(prompt_token_ids, params, self.vocab_size, self.max_model_len, where)


class ProcessAsyncEngine(AsyncEngine):
    def __init__(self, config: EngineConfig, loaded: Callable[[], Any] | None = None, max_waiting: int = 1024,
                 idle_poll_s: float = 0.5, max_waiting_tokens: int | None = None,
                 start_timeout_s: float = START_TIMEOUT_S, make_engine: Callable[..., Any] | None = None):
        """Start the child and wait for its engine. `loaded`: a picklable factory of the LoadedModel (e.g.
        functools.partial(models.synthetic.random_loaded, ...)); None loads `config.model` as LLMEngine does.
        `make_engine(config, loaded=...)`: a picklable stand-in for LLMEngine (benchmarks/server_cpu.py replays
        outputs with one, so the server's own CPU is measured without a model)."""
        if config.tensor_parallel_size > 1:  # the child is daemonic (it dies with the server): it cannot spawn ranks
            raise ValueError(f"engine_process needs tensor_parallel_size=1, got {config.tensor_parallel_size}")
        self._child_args = (config, loaded, make_engine)
        self._start_timeout_s = start_timeout_s
        ready = self._spawn()
        super().__init__(EngineView(config, *ready), max_waiting, idle_poll_s, max_waiting_tokens)
        self._pending: dict[int, tuple] = {}  # command id -> (kind, args, future), until the child answers
        self._ids = itertools.count()
        self._decoder = DeltaDecoder()
        self._receiver: threading.Thread | None = None

    def _spawn(self) -> tuple:
        """Start a child on this engine's arguments and wait until its engine is ready: (info, tokenizer,
        fingerprint, stats)."""
        ctx = multiprocessing.get_context("spawn")  # CUDA cannot be forked
        theirs_in, self._to_child = ctx.Pipe(duplex=False)
        self._from_child, theirs_out = ctx.Pipe(duplex=False)
        self.process = ctx.Process(target=child_main, args=(*self._child_args, theirs_in, theirs_out), daemon=True,
                                   name="samebits-engine")
        self.process.start()
        theirs_in.close()
        theirs_out.close()
        try:
            return self._wait_ready(self._start_timeout_s)
        except BaseException:
            self._end_child(0.0)
            raise

    def restart(self) -> float:
        """After the child died: start another with the same config and wait for it (the load time: call this off
        the event loop), then serve on with it; returns the seconds it took. Its fingerprint must equal the one
        served before, else IdentityChanged and the new child is ended: weights synced since the start
        (update_weights) are not in the checkpoint a restart loads."""
        if self.healthy or self._stopping:
            raise RuntimeError("restart() is for an engine process that died, not one serving or shut down")
        started = time.monotonic()
        self._join_threads()
        for end in (self._to_child, self._from_child):
            end.close()
        _, _, fingerprint, stats = self._spawn()
        changed = diff_fingerprints(self.engine.fingerprint(), fingerprint)
        if changed or self._stopping:
            self._end_child(0.0)
            if self._stopping:
                raise EngineDead("the server shut down while the engine process restarted")
            raise IdentityChanged(changed)
        self.engine._stats = self.stats = stats
        self._pending, self._decoder = {}, DeltaDecoder()
        self._fail_pending_commands()  # any sent while the child was dead: their waiters already gave up
        self.error = None
        self._start_threads()
        return time.monotonic() - started

    def _join_threads(self) -> None:
        for thread in (self._thread, self._receiver):
            if thread is not None:
                thread.join(STOP_TIMEOUT_S)

    def _wait_ready(self, timeout_s: float) -> tuple:
        waited = multiprocessing.connection.wait([self._from_child, self.process.sentinel], timeout_s)
        if self._from_child in waited or self._from_child.poll():
            with contextlib.suppress(EOFError):
                message = self._from_child.recv()
                if message[0] == "ready":
                    return message[1:]
                raise EngineProcessError(f"the engine process failed to start: {message[1]}\n{message[2]}")
        if not waited:
            raise EngineProcessError(f"the engine process did not start within {timeout_s:.0f} s")
        self.process.join(STOP_TIMEOUT_S)
        raise EngineProcessError(f"the engine process exited while loading (exit code {self.process.exitcode})")

    # ---- lifecycle -------------------------------------------------------------------------------------------------
    def start(self) -> None:
        if self._thread is not None:
            return
        self._loop = asyncio.get_running_loop()
        self._start_threads()

    def _start_threads(self) -> None:
        self._thread = threading.Thread(target=self._run, name="samebits-engine", daemon=True)
        self._receiver = threading.Thread(target=self._receive, name="samebits-engine-receiver", daemon=True)
        self._thread.start()
        self._receiver.start()

    def shutdown(self, timeout: float = STOP_TIMEOUT_S) -> None:
        sender = self._thread
        super().shutdown(timeout)  # the sender tells the child to stop as it ends
        if sender is None or not sender.is_alive():
            with contextlib.suppress(OSError):
                self._to_child.send(None)
        self._end_child(timeout)
        if self._receiver is not None:
            self._receiver.join(timeout)

    def _end_child(self, timeout: float) -> None:
        self.process.join(timeout)
        if self.process.is_alive():
            self.process.terminate()
            self.process.join(STOP_TIMEOUT_S)
        if self.process.is_alive():
            self.process.kill()
            self.process.join()

    @property
    def healthy(self) -> bool:
        return super().healthy and self.process.is_alive()

    async def call(self, fn):
        raise TypeError("call(fn) runs a closure on the engine thread; with the engine in its own process "
                        "(engine_process) only named commands cross: command(name, ...)")

    async def command(self, name: str, *args) -> Any:
        engine_command(name)  # an unknown name is refused here, before anything crosses
        return await asyncio.wrap_future(self._submit("call", name, args))

    # ---- the sender thread (AsyncEngine's engine thread) -----------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping and self.error is None:
                self._wake.clear()
                while self._commands:
                    self._send(*self._commands.popleft())
                self._wake.wait(self._idle_poll_s)
        finally:
            with contextlib.suppress(OSError):
                self._to_child.send(None)
            self._fail_pending_commands()

    def _send(self, kind: str, args: tuple, future: concurrent.futures.Future) -> None:
        command_id = next(self._ids)
        self._pending[command_id] = (kind, args, future)  # before sending: the answer may come at once
        try:
            self._to_child.send((kind, command_id, args))
        except OSError:
            pass  # the child is gone: the receiver says why and fails every pending command
        if self.error is not None:  # the receiver may have failed the pending ones before this one was added
            self._fail_in_flight()

    # ---- the receiver thread ---------------------------------------------------------------------------------------
    def _receive(self) -> None:
        try:
            while True:
                self._handle(self._from_child.recv())
        except EOFError:
            self.process.join(STOP_TIMEOUT_S)
            error = None if self._stopping else EngineProcessError(
                f"the engine process exited (exit code {self.process.exitcode})")
        except BaseException as e:  # noqa: BLE001 - the child's own failure, or a broken pipe: every waiter hears it
            error = e
        self.error = error
        self._fail_in_flight()
        self._post(self._fail_all, error or RuntimeError("the engine was shut down"))
        self._post_death()
        self._wake.set()

    def _handle(self, message: tuple) -> None:
        kind = message[0]
        if kind == "step":
            _, deltas, progress, self.stats = message
            if progress:
                self._post(self._dispatch, self._decoder.decode(deltas), progress)
        elif kind == "done":
            self._answer(*message[1:])
        else:  # "dead": the child's exception, then it exits
            error = EngineProcessError(message[1])
            error.add_note(message[2])  # its traceback, for the log; clients hear only the message
            raise error

    def _answer(self, command_id: int, error: BaseException | None, result: Any, stats, fingerprint) -> None:
        kind, args, future = self._pending.pop(command_id)
        if stats is not None:
            self.stats = stats
        if fingerprint is not None:
            self.engine._fingerprint = fingerprint
        if kind == "abort":
            self._decoder.forget(args[0])
        _settle(future, error if kind != "abort" else None, result)

    def _fail_in_flight(self) -> None:
        while self._pending:
            _, _, future = self._pending.popitem()[1]
            _settle(future, EngineDead("the engine loop has stopped"))


# ---- the child ---------------------------------------------------------------------------------------------------------
def child_main(config: EngineConfig, loaded: Callable[[], Any] | None, make_engine: Callable[..., Any] | None,
               commands, outputs) -> None:
    from samebits.engine.llm_engine import LLMEngine
    from samebits.runtime import runtime_for

    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with runtime_for(config.mode):
            engine = (make_engine or LLMEngine)(config, loaded=loaded() if loaded is not None else None)
            # The engine, torch and the model live as long as this process: the cyclic collector's full passes skip
            # them instead of walking them again between steps (as the server's process does, server/app.py).
            gc.freeze()
            outputs.send(("ready", engine.info(), engine.tokenizer, engine.fingerprint(), engine.stats()))
            serve_commands(engine, commands, outputs)
    except (EOFError, BrokenPipeError):
        pass  # the server is gone, however it ended
    except BaseException as e:  # noqa: BLE001 - the server must hear why, then this process ends
        with contextlib.suppress(OSError):
            outputs.send(("dead", f"{type(e).__name__}: {e}", traceback.format_exc()))


def serve_commands(engine, commands, outputs) -> None:
    """Commands in order between steps, as AsyncEngine's thread applies them; a step while any request is open.
    `commands`: poll(timeout)/recv(); `outputs`: send(message): this process's pipes, or a fleet replica's queues
    (samebits/fleet/replica.py)."""
    encoder = DeltaEncoder()
    while True:
        # Every command already sent first; waiting for one only while there is nothing to step.
        while commands.poll(0 if engine.has_unfinished_requests() else None):
            message = commands.recv()
            if message is None:
                return
            outputs.send(_apply(engine, encoder, *message))
        if engine.has_unfinished_requests():
            deltas = encoder.encode(engine.step())
            outputs.send(("step", deltas, engine.progress(), engine.stats()))


def _apply(engine, encoder: DeltaEncoder, kind: str, command_id: int, args: tuple) -> tuple:
    # A bad request (or an unknown id to abort, or a failed command) fails that command, never the loop.
    error = result = None
    try:
        if kind == "add":
            request_id, ids, params, prompt, resume = args
            engine.add_request(request_id, ids, params, prompt=prompt, resume=resume)
            return "done", command_id, None, None, None, None
        if kind == "abort":
            encoder.forget(args[0])
            engine.abort_request(args[0])
        else:
            name, values = args
            result = engine_command(name)(engine, *values)
    except Exception as e:  # noqa: BLE001
        error = _portable(e)
    # An abort's freed blocks and a command's new weights show at once, not after the next step.
    return "done", command_id, error, result, engine.stats(), engine.fingerprint() if kind == "call" else None


def _portable(error: Exception) -> Exception:
    """The exception itself when it survives pickling (its type is what the server maps to a status), else its text."""
    try:
        pickle.loads(pickle.dumps(error))
    except Exception:  # noqa: BLE001 - whatever fails to cross is sent as text
        return RuntimeError(f"{type(error).__name__}: {error}")
    return error
