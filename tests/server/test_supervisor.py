"""The engine supervisor (server/supervisor.py) on stand-in engines: a death is one log line and zeroed gauges, a
restart is tried while the bound allows, and past it (or for an engine thread, or a changed fingerprint) the server
is told to exit. The real engine process killed with SIGKILL: tests/server/test_engine_process.py."""
from __future__ import annotations

import asyncio
import logging

import pytest

from samebits.engine.engine_process import EngineProcessError, IdentityChanged
from samebits.engine.outputs import EngineStats
from samebits.server.supervisor import DEAD, OK, STARTING, EngineSupervisor


class Restartable:
    """An engine process's surface: healthy, stats, on_dead; restart() answers from a script of outcomes."""

    def __init__(self, outcomes):
        self.healthy, self.on_dead = True, None
        self.stats = EngineStats(16, 3, 0.5, 10, 4, 1, 100, 200)
        self.outcomes = list(outcomes)
        self.engine = self

    def fingerprint(self) -> dict:
        return {"hash": "abc"}

    def die(self) -> None:
        self.healthy = False
        self.on_dead(EngineProcessError("the engine process exited (exit code -9)"))

    def restart(self) -> float:
        outcome = self.outcomes.pop(0)
        if isinstance(outcome, BaseException):
            raise outcome
        self.healthy = True
        return outcome


class Thread(Restartable):
    restart = None


async def _settle(supervisor) -> None:
    while supervisor.status == STARTING:
        await asyncio.sleep(0.001)


def _run(engine, max_restarts: int, deaths: int):
    """Kill `engine` `deaths` times, each once the supervisor has settled; (statuses seen, gave_up, exits asked)."""
    exits = []

    async def main():
        supervisor = EngineSupervisor(engine, max_restarts, on_give_up=lambda: exits.append(1))
        seen = [supervisor.status]
        for _ in range(deaths):
            engine.die()
            seen.append(supervisor.status)
            await _settle(supervisor)
            seen.append(supervisor.status)
        return seen, supervisor

    seen, supervisor = asyncio.run(main())
    return seen, supervisor, exits


def test_a_death_is_restarted_until_the_bound_then_the_server_exits(caplog):
    engine = Restartable([0.1, EngineProcessError("exited while loading (exit code 1)"), 0.1])
    with caplog.at_level(logging.INFO, "samebits.server"):
        seen, supervisor, exits = _run(engine, max_restarts=2, deaths=2)
    # Death 1: restarted. Death 2: the restart fails to load, counted; the bound is reached: no third try.
    assert seen == [OK, STARTING, OK, STARTING, DEAD] and supervisor.restarts == 2 and exits == [1]
    assert "after 2 restart(s)" in supervisor.gave_up and engine.outcomes == [0.1], "no restart past the bound"
    deaths = [r for r in caplog.records if "died" in r.getMessage()]
    assert [r.levelno for r in deaths] == [logging.ERROR] * 3, "one line per death, one for the failed load"
    assert engine.stats.num_running == engine.stats.num_waiting == 0 and engine.stats.kv_usage == 0
    assert engine.stats.prefix_hits == 4, "counters are not gauges: kept"


def test_within_the_bound_the_server_serves_on():
    """Control: the same deaths under a bound of 3 leave the server serving, nothing asked to exit."""
    engine = Restartable([0.1, EngineProcessError("exited while loading (exit code 1)"), 0.1])
    seen, supervisor, exits = _run(engine, max_restarts=3, deaths=2)
    assert seen[-1] == OK and supervisor.gave_up is None and exits == [] and supervisor.restarts == 3


@pytest.mark.parametrize("engine", [Thread([]), Restartable([IdentityChanged([("weights", "step-3", "base")])])],
                         ids=["engine-thread", "fingerprint-changed"])
def test_what_cannot_be_restarted_gives_up_at_once(engine):
    seen, supervisor, exits = _run(engine, max_restarts=3, deaths=1)
    assert seen[-1] == DEAD and exits == [1]
    assert "not restarted" in supervisor.gave_up or "weights: served 'step-3', restarted 'base'" in supervisor.gave_up


def test_serve_exits_with_status_1_when_the_engine_is_lost(monkeypatch):
    """`samebits serve` turns the supervisor's give-up (serve.EngineLost) into one line and status 1, for systemd or
    Kubernetes to restart it; a bad flag stays status 2."""
    from typer.testing import CliRunner

    import samebits.server.serve as serve_mod
    from samebits.cli import app

    def lost(config):
        raise serve_mod.EngineLost("the server stopped: the engine process died (exit code -9) after 3 restart(s)")

    monkeypatch.setattr(serve_mod, "serve", lost)
    result = CliRunner().invoke(app, ["serve", "--max-engine-restarts", "3"])
    assert result.exit_code == 1 and result.output.count("\n") == 1 and "after 3 restart(s)" in result.output
    assert CliRunner().invoke(app, ["serve", "--max-engine-restarts", "-1"]).exit_code == 2


class Fleet:
    """A fleet's surface (samebits/fleet/engine.py): no on_dead, no restart; `restarting` while its replicas come back."""

    def __init__(self):
        self.healthy, self.restarting = True, False


def test_a_fleet_is_read_not_restarted():
    """A fleet brings its own replicas back: the supervisor hooks nothing on it and says `starting` while every replica
    is down and one is coming back; control: down with none coming back is dead."""
    fleet = Fleet()
    supervisor = EngineSupervisor(fleet, max_restarts=0)
    assert supervisor.status == OK and not hasattr(fleet, "on_dead")
    fleet.healthy, fleet.restarting = False, True
    assert supervisor.status == STARTING
    fleet.restarting = False
    assert supervisor.status == DEAD and supervisor.gave_up is None
