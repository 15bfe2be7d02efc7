"""EngineSupervisor: what the server does when its engine dies.

The engine reports its death on the event loop at once (AsyncEngine.on_dead: the engine process's pipe closes, or
the engine thread's loop raises), after every waiter has been failed with EngineDead (503 `engine_dead`). The
supervisor then logs one line, zeroes the gauges the dead engine last reported, and restarts an engine process with
the same config, checking that the new one has the same fingerprint (ProcessAsyncEngine.restart), at most
`max_engine_restarts` times over the server's life. Past that, or when the engine cannot be restarted (the engine
thread, whose process may hold a broken device; a fingerprint that changed), it gives up: `on_give_up` makes the
server exit non-zero (serve.py), so systemd or Kubernetes restarts it whole.

`status` is what /health and /ready say: "ok", "starting" while a restart loads, "engine_dead" after giving up.
A fleet (samebits/fleet/engine.py) restarts its own replicas through Ray, each replica without bound, and never
reports a death here (it has no on_dead): the supervisor only reads it, "starting" while every replica is down and
one is coming back (FleetEngine.restarting), "ok" while one serves.
"""
from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections.abc import Callable

log = logging.getLogger("samebits.server")

OK, STARTING, DEAD = "ok", "starting", "engine_dead"


class EngineSupervisor:
    def __init__(self, async_engine, max_restarts: int, on_give_up: Callable[[], None] | None = None):
        self.ae = async_engine
        self.max_restarts = max_restarts
        self.on_give_up = on_give_up
        self.restarts = 0  # restarts tried, whether or not the engine came back
        self.gave_up: str | None = None  # why, once it has
        self.last_restart_s: float | None = None  # the last restart's spawn and load, in seconds
        self._restarting = False
        self._task: asyncio.Task | None = None
        if hasattr(async_engine, "on_dead"):
            async_engine.on_dead = self._died

    @property
    def status(self) -> str:
        if self._restarting or getattr(self.ae, "restarting", False):
            return STARTING
        return OK if self.ae.healthy else DEAD

    def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()

    # ---- on the event loop ---------------------------------------------------------------------------------
    def _died(self, error: BaseException) -> None:
        self._zero_gauges()
        if getattr(self.ae, "restart", None) is None:
            self._give_up(f"the engine loop died ({_reason(error)}); an engine thread is not restarted")
            return
        if self.restarts >= self.max_restarts:
            self._give_up(f"the engine process died ({_reason(error)}) after {self.restarts} restart(s), the most "
                          f"--max-engine-restarts={self.max_restarts} allows")
            return
        log.error("the engine process died (%s); every request in flight failed with 503 engine_dead; restarting it "
                  "(restart %d of at most %d)", _reason(error), self.restarts + 1, self.max_restarts)
        self._restarting = True
        self._task = asyncio.get_running_loop().create_task(self._restart())

    async def _restart(self) -> None:
        from samebits.engine.engine_process import IdentityChanged

        try:
            seconds = await asyncio.to_thread(self.ae.restart)
        except IdentityChanged as e:
            self._restarting = False
            self._give_up(str(e))
            return
        except Exception as e:  # noqa: BLE001 - a child that failed to load: counted, and retried while allowed
            self._restarting = False
            self.restarts += 1
            self._died(e)
            return
        self._restarting = False
        self.restarts += 1
        self.last_restart_s = seconds
        log.info("the engine process serves again after %.1f s, fingerprint %s unchanged", seconds,
                 self.ae.engine.fingerprint()["hash"])

    def _zero_gauges(self) -> None:
        """Nothing runs or waits in a dead engine, whatever it last reported."""
        stats = self.ae.stats
        if stats is not None:
            self.ae.stats = dataclasses.replace(stats, num_running=0, num_waiting=0, kv_usage=0.0)

    def _give_up(self, why: str) -> None:
        self.gave_up = why
        log.error("%s; the server exits with status 1", why)
        if self.on_give_up is not None:
            self.on_give_up()


def _reason(error: BaseException) -> str:
    text = str(error)
    return text if text.startswith("the engine") else f"{type(error).__name__}: {text}"
