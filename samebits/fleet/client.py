"""ReplicaClient: the front end's handle on one replica, an engine process reached through Ray instead of a pipe.

Everything on the event loop's side is ProcessAsyncEngine's (and so AsyncEngine's): streams, admission, commands by
name, the rebuilt outputs (output_deltas.py). Two threads talk to the actor: the sender hands it every queued command
in one `submit` call, and the receiver long-polls `poll` for the engine loop's messages. A replica whose process dies
(RayActorError), whose engine loop fails ("dead"), or that does not answer a poll within `answer_timeout_s` is lost:
every waiter hears EngineDead, and `on_lost(client, died)` tells the fleet (on the event loop), which re-runs its
requests elsewhere and brings the replica back.
"""
from __future__ import annotations

import collections
import contextlib
import itertools
import logging
from collections.abc import Callable

from samebits.engine.async_engine import AsyncEngine
from samebits.engine.engine_process import EngineProcessError, EngineView, ProcessAsyncEngine
from samebits.engine.output_deltas import DeltaDecoder
from samebits.fleet.replica import EOF_MESSAGE

log = logging.getLogger("samebits.fleet")

# How long one poll waits for the engine loop's first message: the longest a step's outputs wait for a fresh poll
# when none is in flight, and the beat at which a silent replica is noticed.
POLL_WAIT_S = 1.0


class ReplicaLost(Exception):
    """The replica died or stopped answering. `died`: its process ended (Ray restarts it); otherwise it must be
    killed to be restarted."""

    def __init__(self, message: str, died: bool):
        super().__init__(message)
        self.died = died


def _ray_errors() -> tuple:
    from ray.exceptions import RayActorError, RayTaskError

    return RayActorError, RayTaskError


class _Sender:
    """The command pipe's sending end: one `submit` call per batch, waited for, so batches arrive in order."""

    def __init__(self, actor):
        self.actor = actor

    def send_all(self, commands: list) -> None:
        import ray

        try:
            ray.get(self.actor.submit.remote(commands))
        except _ray_errors() as e:
            raise OSError(f"the replica did not take its commands: {e}") from None


class _Receiver:
    """The output pipe's receiving end: recv() one message at a time, polling the actor for more."""

    def __init__(self, actor, answer_timeout_s: float):
        self.actor, self.answer_timeout_s = actor, answer_timeout_s
        self._buffer: collections.deque = collections.deque()

    def recv(self):
        import ray
        from ray.exceptions import GetTimeoutError

        while not self._buffer:
            try:
                self._buffer.extend(ray.get(self.actor.poll.remote(POLL_WAIT_S),
                                            timeout=POLL_WAIT_S + self.answer_timeout_s))
            except GetTimeoutError:
                raise ReplicaLost(f"it did not answer within {self.answer_timeout_s:.0f} s", died=False) from None
            except _ray_errors() as e:
                raise ReplicaLost(f"its process ended ({type(e).__name__})", died=True) from None
        message = self._buffer.popleft()
        if message == EOF_MESSAGE:
            raise EOFError
        return message


class ReplicaClient(ProcessAsyncEngine):
    def __init__(self, index: int, actor, ready: tuple, config, max_waiting: int, max_waiting_tokens: int | None,
                 answer_timeout_s: float, on_lost: Callable[[ReplicaClient, bool], None]):
        """`ready`: the actor's `ready()` answer. The child's constructor is not run: the engine is the actor's."""
        info, tokenizer, fingerprint, stats, self.pid = ready
        AsyncEngine.__init__(self, EngineView(config, info, tokenizer, fingerprint, stats), max_waiting,
                             POLL_WAIT_S, max_waiting_tokens)
        self.index, self.actor, self.on_lost = index, actor, on_lost
        self._to_child = _Sender(actor)
        self._from_child = _Receiver(actor, answer_timeout_s)
        self._pending: dict[int, tuple] = {}
        self._ids = itertools.count()
        self._decoder = DeltaDecoder()
        self._receiver = None
        self.lost: ReplicaLost | None = None

    @property
    def healthy(self) -> bool:
        return super(ProcessAsyncEngine, self).healthy

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop the sender (which stops the engine loop, unless the replica was lost: its restarted process must
        not hear the old stop) and the receiver; the actor's life is the fleet's (cluster.py)."""
        AsyncEngine.shutdown(self, timeout)
        if self._receiver is not None:
            self._receiver.join(timeout)

    # ---- the sender thread -------------------------------------------------------------------------------------
    def _run(self) -> None:
        try:
            while not self._stopping and self.error is None:
                self._wake.clear()
                batch = []
                while self._commands:
                    kind, args, future = self._commands.popleft()
                    command_id = next(self._ids)
                    self._pending[command_id] = (kind, args, future)  # before sending: the answer may come at once
                    batch.append((kind, command_id, args))
                if batch:
                    with contextlib.suppress(OSError):  # the receiver says why and fails every pending command
                        self._to_child.send_all(batch)
                    if self.error is not None:
                        self._fail_in_flight()
                self._wake.wait(self._idle_poll_s)
        finally:
            if self.lost is None:
                with contextlib.suppress(OSError):
                    self._to_child.send_all([None])
            self._fail_pending_commands()

    # ---- the receiver thread -----------------------------------------------------------------------------------
    def _receive(self) -> None:
        try:
            while True:
                self._handle(self._from_child.recv())
        except EOFError:
            error = None if self._stopping else ReplicaLost("its engine loop ended", died=False)
        except EngineProcessError as e:  # the engine loop's own failure: the replica must be restarted
            error = ReplicaLost(str(e), died=False)
        except ReplicaLost as e:
            error = e
        except BaseException as e:  # noqa: BLE001 - every waiter must hear it
            error = ReplicaLost(f"{type(e).__name__}: {e}", died=False)
        self.lost = error  # before error: the sender, seeing error, reads lost
        self.error = error
        self._fail_in_flight()
        self._post(self._fail_all, error or RuntimeError("the engine was shut down"))
        if error is not None:
            log.warning("replica %d lost: %s", self.index, error)
            self._post(self.on_lost, self, error.died)
        self._wake.set()
