"""One replica: a whole LLMEngine inside a Ray actor, driven as an engine process is (engine/engine_process.py).

The engine runs in a thread of the actor, applying commands between steps with the engine process's own loop
(`serve_commands`); its two pipes are in-process queues here. Ray calls reach them from the actor's other threads (a
threaded actor, `MAX_CONCURRENCY`): `submit` hands a batch of commands in, in order; `poll` hands out the messages the
loop sent (step deltas, command answers), waiting up to its `wait_s` for the first, so the front end learns of a
step within a round trip and of a silent replica within `wait_s` plus its timeout. `ready` answers once the engine
has loaded: its info, tokenizer, fingerprint, stats and this process's id. The actor knows nothing of the others.
"""
from __future__ import annotations

import collections
import concurrent.futures
import os
import threading
import traceback

# ready, submit and poll may wait at once, and a test's pid call beside them.
MAX_CONCURRENCY = 4
# The message poll answers once the engine loop has ended (a clean stop): the pipe's end of file.
EOF_MESSAGE = ("eof",)


class Inbox:
    """The engine loop's command pipe: poll(timeout) and recv(), as a multiprocessing Connection's."""

    def __init__(self) -> None:
        self._items: collections.deque = collections.deque()
        self._cond = threading.Condition()

    def put(self, items: list) -> None:
        with self._cond:
            self._items.extend(items)
            self._cond.notify_all()

    def poll(self, timeout: float | None = None) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: bool(self._items), timeout)

    def recv(self):
        with self._cond:
            return self._items.popleft()


class Outbox:
    """The engine loop's output pipe: send(message); `take` hands out everything sent so far."""

    def __init__(self) -> None:
        self._items: list = []
        self._closed = False
        self._cond = threading.Condition()

    def send(self, message) -> None:
        with self._cond:
            self._items.append(message)
            self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def take(self, wait_s: float) -> list:
        with self._cond:
            self._cond.wait_for(lambda: self._items or self._closed, wait_s)
            items, self._items = self._items, []
            if self._closed and not items:
                return [EOF_MESSAGE]
            return items


class Replica:
    """The actor's class (cluster.py wraps it with ray.remote and its resources). `threads`: torch's intra-op
    threads here (on a CPU, the replica's share of the cores; they are in its fingerprint). `make_engine(config)`: a
    stand-in for LLMEngine (benchmarks/fleet.py replays outputs with one, to measure the fleet without a model)."""

    def __init__(self, config, threads: int | None = None, make_engine=None):
        import torch

        if threads is not None:
            torch.set_num_threads(threads)
        self._inbox, self._outbox = Inbox(), Outbox()
        self._ready: concurrent.futures.Future = concurrent.futures.Future()
        self._thread = threading.Thread(target=self._run, args=(config, make_engine), name="samebits-replica",
                                        daemon=True)
        self._thread.start()

    def _run(self, config, make_engine) -> None:
        from samebits.engine.engine_process import serve_commands
        from samebits.engine.llm_engine import LLMEngine
        from samebits.runtime import runtime_for

        try:
            with runtime_for(config.mode):
                engine = (make_engine or LLMEngine)(config)
                self._ready.set_result((engine.info(), engine.tokenizer, engine.fingerprint(), engine.stats(),
                                        os.getpid()))
                serve_commands(engine, self._inbox, self._outbox)
        except BaseException as e:  # noqa: BLE001 - the front end must hear why
            if not self._ready.done():
                self._ready.set_exception(RuntimeError(f"the replica failed to start: {type(e).__name__}: {e}"))
            else:
                self._outbox.send(("dead", f"{type(e).__name__}: {e}", traceback.format_exc()))
        finally:
            self._outbox.close()

    def ready(self, timeout_s: float | None = None) -> tuple:
        """(EngineInfo, tokenizer, fingerprint, EngineStats, pid) once the engine has loaded."""
        return self._ready.result(timeout_s)

    def submit(self, commands: list) -> None:
        """Commands for the engine loop, in order: (kind, command id, args) tuples, or None to stop it."""
        self._inbox.put([_resolved(c) for c in commands])

    def poll(self, wait_s: float) -> list:
        return self._outbox.take(wait_s)

    def pid(self) -> int:
        return os.getpid()


def _resolved(command):
    """A named command's arguments put in Ray's object store once for every replica (a weight update's tensors),
    fetched here."""
    if command is None or command[0] != "call":
        return command
    import ray

    kind, command_id, (name, values) = command
    return kind, command_id, (name, tuple(ray.get(v) if isinstance(v, ray.ObjectRef) else v for v in values))
