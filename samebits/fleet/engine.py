"""FleetEngine: the AsyncEngine the server drives when it serves N replicas (`--data-parallel-size N`).

- **Identity.** Every replica reports its fingerprint when it has loaded; the fleet starts only if all are equal
  (identity.py names the differing fields) and answers with that one. A replica that comes back later is admitted
  only with the fleet's fingerprint, after the fleet's last weight update is applied to it.
- **Routing.** Each request goes to one replica (router.py); the seed of a request that sends none is drawn here,
  from the fleet's one seed stream, so it never depends on the replica.
- **Failover.** A replica lost mid-request (client.py) is taken out of the router and its requests go on elsewhere:
  a non-streamed one runs again from the start; a streamed one resumes from its last output (LLMEngine.add_request's
  `resume`: the sent tokens teacher-forced, then decoding on with the same draws), so the client reads one stream
  with the bits of an uninterrupted run. The replica is brought back (Ray restarts it) and readmitted.
- **Weight updates.** update_weights closes a gate to new requests, waits for the ones in flight, updates every live
  replica keeping its old weights, then keeps the update everywhere or restores the old weights everywhere: no
  response mixes versions, and each names its version in its fingerprint.
"""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import logging
from dataclasses import fields

from samebits.engine.async_engine import Counters, EngineDead, QueueFull, check_request_size, waiting_cost
from samebits.engine.config import EngineConfig
from samebits.engine.engine_process import START_TIMEOUT_S, EngineView
from samebits.engine.outputs import EngineStats, Resume
from samebits.fleet import cluster
from samebits.fleet.client import ReplicaClient
from samebits.fleet.identity import check_identity
from samebits.fleet.router import Router

log = logging.getLogger("samebits.fleet")

# A replica that does not answer a poll within this many seconds (beyond the poll's own wait) is taken for hung.
ANSWER_TIMEOUT_S = 30.0
# How long a request waits for a live replica when none is (all lost at once) before it fails.
FAILOVER_TIMEOUT_S = 120.0
# Between two attempts to bring a lost replica back.
REJOIN_RETRY_S = 1.0


def _hook(name: str) -> property:
    """One of AsyncEngine's latency hooks (the server's metrics set them): set on every replica's client."""

    def get(self):
        return self._hooks[name]

    def put(self, value) -> None:
        self._hooks[name] = value
        for client in self._all:
            setattr(client, name, value)

    return property(get, put)


class FleetEngine:
    on_first_output = _hook("on_first_output")
    on_finished = _hook("on_finished")
    on_step = _hook("on_step")

    def __init__(self, config: EngineConfig, max_waiting: int = 1024, max_waiting_tokens: int | None = None,
                 make_engine=None, answer_timeout_s: float = ANSWER_TIMEOUT_S,
                 start_timeout_s: float = START_TIMEOUT_S):
        """Start (or join) Ray, start `config.data_parallel_size` replicas and wait until each has loaded and shown
        the same fingerprint; IdentityError (a ValueError) naming the fields if they differ."""
        self.config, self.max_waiting, self.max_waiting_tokens = config, max_waiting, max_waiting_tokens
        self.make_engine, self.answer_timeout_s, self.start_timeout_s = make_engine, answer_timeout_s, start_timeout_s
        size = config.data_parallel_size
        self._ray = cluster.connect(config.ray_address)
        self.actors: list = []
        try:
            threads = cluster.replica_threads(size)
            self.actors = [cluster.spawn(config, threads, make_engine) for _ in range(size)]
            readies = [cluster.ready(a, start_timeout_s) for a in self.actors]
            self.identity = dict(readies[0][2])
            for i, ready in enumerate(readies):
                check_identity(self.identity, ready[2], f"replica {i}")
        except BaseException:
            self._end_cluster()
            raise
        info, tokenizer, _, stats, _ = readies[0]
        self.engine = EngineView(config, info, tokenizer, dict(self.identity), stats)
        self.router = Router(size, info.block_size)
        self.clients: list[ReplicaClient | None] = [None] * size
        self._all: list[ReplicaClient] = []
        self.states = ["starting"] * size
        self.restarts = [0] * size
        self.failovers = 0
        self.resumed = 0  # failovers of a stream that went on from its last output
        self._rejected = 0
        self._hooks: dict[str, object] = {"on_first_output": None, "on_finished": None, "on_step": None}
        self._weights: tuple | None = None  # (object ref, version) of the last update, for replicas coming back
        self._open = asyncio.Event()  # closed while a weight update runs
        self._open.set()
        self._idle = asyncio.Event()  # set while no request is in flight
        self._idle.set()
        self._live = asyncio.Event()  # set while some replica serves
        self._update_lock = asyncio.Lock()
        self._active = 0
        self._stopping = False
        self._loop: asyncio.AbstractEventLoop | None = None
        self._tasks: set[asyncio.Task] = set()
        for i, ready in enumerate(readies):
            self._admit(i, self._client(i, ready))

    # ---- the ServedEngine interface (engine/interface.py) ------------------------------------------------------
    def start(self) -> None:
        if self._loop is not None:
            return
        self._loop = asyncio.get_running_loop()
        for client in self.clients:
            if client is not None:
                client.start()

    def shutdown(self, timeout: float = 10.0) -> None:
        self._stopping = True
        for task in self._tasks:
            task.cancel()
        for client in self._all:
            client.shutdown(timeout)
        self._end_cluster()

    def _end_cluster(self) -> None:
        for actor in self.actors:
            cluster.kill(actor, restart=False)
        cluster.disconnect(self._ray)
        self._ray = None

    @property
    def healthy(self) -> bool:
        return not self._stopping and bool(self.router.live)

    @property
    def restarting(self) -> bool:
        """No replica serves but one is being brought back (the server's /health says `starting`, not dead)."""
        return not self.healthy and not self._stopping and "restarting" in self.states

    @property
    def counters(self) -> Counters:
        total = Counters(requests_rejected=self._rejected)
        for client in self._all:
            for f in fields(Counters):
                setattr(total, f.name, getattr(total, f.name) + getattr(client.counters, f.name))
        return total

    @property
    def stats(self) -> EngineStats:
        live = [c.stats for c in self.clients if c is not None and c.stats is not None]
        if not live:
            return self.engine.stats()
        sums = {f.name: _total([getattr(s, f.name) for s in live]) for f in fields(EngineStats)}
        sums["kv_usage"] /= len(live)
        return EngineStats(**sums)

    def check_admission(self, seqs: int, tokens: int) -> None:
        """One request goes to one replica: it must fit one replica's limits; the fleet queues N replicas' worth."""
        check_request_size(seqs, tokens, self.max_waiting, self.max_waiting_tokens, " per replica")
        limit = self.max_waiting_tokens
        live = [c for c in self.clients if c is not None]
        waiting = [c.waiting_cost for c in live]
        scale = max(1, len(live))
        if sum(w[0] for w in waiting) + seqs > self.max_waiting * scale or (
                limit is not None and sum(w[1] for w in waiting) + tokens > limit * scale):
            self._rejected += 1
            raise QueueFull(self.max_waiting * scale)

    async def generate(self, request_id: str, prompt_token_ids: list[int], params, prompt: str | None = None, *,
                       final_only: bool = False, resume: Resume | None = None):
        """AsyncEngine.generate's outputs, from whichever replicas run the request to its end."""
        if params.seed is None:
            params = dataclasses.replace(params, seed=self.engine.draw_seed())
        while not self._open.is_set():
            await self._open.wait()
        self._active += 1
        self._idle.clear()
        tokens = waiting_cost(len(prompt_token_ids), params)[1]
        try:
            while True:
                client = await self._pick(prompt_token_ids)
                last = None
                self.router.started(client.index, tokens)
                try:
                    async for out in client.generate(request_id, prompt_token_ids, params, prompt,
                                                     final_only=final_only, resume=resume):
                        last = out
                        yield out
                    return
                except EngineDead:
                    if self._stopping:
                        raise
                    self.router.set_up(client.index, False)
                finally:
                    self.router.ended(client.index, tokens)
                self.failovers += 1
                if last is not None:  # a stream: on from its last output; a whole response runs again
                    resume = Resume.of(last)
                    self.resumed += 1
        finally:
            self._active -= 1
            if self._active == 0:
                self._idle.set()

    async def _pick(self, prompt_token_ids: list[int]) -> ReplicaClient:
        deadline = asyncio.get_running_loop().time() + FAILOVER_TIMEOUT_S
        while True:
            index = self.router.pick(prompt_token_ids)
            if index is not None:
                return self.clients[index]
            left = deadline - asyncio.get_running_loop().time()
            if self._stopping or left <= 0:
                raise EngineDead("no replica of the fleet is serving")
            self._live.clear()
            try:
                await asyncio.wait_for(self._live.wait(), left)
            except TimeoutError:
                pass

    async def call(self, fn):
        raise TypeError("call(fn) runs a closure on one engine; a fleet runs named commands on every replica")

    async def command(self, name: str, *args):
        if name != "update_weights":
            raise ValueError(f"a fleet runs update_weights on its replicas, not {name!r}")
        return await self.update_weights(*args)

    # ---- weight sync -------------------------------------------------------------------------------------------
    async def update_weights(self, source, version: str | None = None) -> str:
        """New weights in every live replica between requests, or in none: requests that arrive meanwhile wait, those
        in flight end on the old weights first. Returns the version now in the fleet's fingerprint."""
        import ray

        from samebits.engine.weights import tensors_of

        async with self._update_lock:
            self._open.clear()
            try:
                await self._idle.wait()
                ref = ray.put(tensors_of(source))
                live = [c for c in self.clients if c is not None]
                results = await asyncio.gather(*(c.command("update_weights", ref, version, True) for c in live),
                                               return_exceptions=True)
                failed = [r for r in results if isinstance(r, BaseException)]
                kept = [c for c, r in zip(live, results) if not isinstance(r, BaseException)]
                if failed:
                    await asyncio.gather(*(c.command("restore_weights") for c in kept), return_exceptions=True)
                    raise failed[0]
                await asyncio.gather(*(c.command("forget_previous_weights") for c in kept), return_exceptions=True)
                new = results[0]
                self._weights = (ref, new)
                self._set_identity(kept[0].engine.fingerprint())
                return new
            finally:
                self._open.set()

    def _set_identity(self, fingerprint: dict) -> None:
        self.identity = dict(fingerprint)
        self.engine._fingerprint = dict(fingerprint)

    # ---- replicas in and out -----------------------------------------------------------------------------------
    def _client(self, index: int, ready: tuple) -> ReplicaClient:
        client = ReplicaClient(index, self.actors[index], ready, self.config, self.max_waiting,
                               self.max_waiting_tokens, self.answer_timeout_s, self._lost)
        for name, hook in self._hooks.items():
            setattr(client, name, hook)
        self._all.append(client)
        return client

    def _admit(self, index: int, client: ReplicaClient) -> None:
        self.clients[index] = client
        self.states[index] = "up"
        self.router.set_up(index, True)
        self._live.set()

    def _lost(self, client: ReplicaClient, died: bool) -> None:
        """On the event loop, once per lost client: out of the router, and brought back in the background."""
        index = client.index
        if self.clients[index] is not client:
            return
        self.clients[index] = None
        self.router.set_up(index, False)
        self.states[index] = "restarting"
        self.restarts[index] += 1
        if self._stopping:
            return
        task = asyncio.ensure_future(self._rejoin(index, kill=not died))
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)
        self._tasks.add(asyncio.ensure_future(asyncio.to_thread(client.shutdown, 1.0)))

    async def _rejoin(self, index: int, kill: bool) -> None:
        """Bring replica `index` back: Ray restarts its process (killed first if it hung); admitted once it has
        loaded, taken the fleet's weights and shown the fleet's fingerprint."""
        actor = self.actors[index]
        if kill:
            cluster.kill(actor, restart=True)
        while not self._stopping:
            try:
                ready = await asyncio.to_thread(cluster.ready, actor, self.start_timeout_s)
                break
            except Exception as e:  # noqa: BLE001 - restarting: try again
                log.info("replica %d not back yet: %s", index, e)
                await asyncio.sleep(REJOIN_RETRY_S)
        else:
            return
        client = self._client(index, ready)
        client.start()
        async with self._update_lock:
            try:
                if self._weights is not None:
                    await client.command("update_weights", *self._weights)
                check_identity(self.identity, client.engine.fingerprint(), f"replica {index}")
            except Exception as e:  # noqa: BLE001 - not admitted, and why
                log.error("replica %d is not admitted: %s", index, e)
                self.states[index] = f"refused: {e}"
                await asyncio.to_thread(client.shutdown, 1.0)
                return
            self._admit(index, client)
        log.info("replica %d is back (pid %d)", index, client.pid)

    def health(self) -> dict:
        """Per replica: its state, process, load and restarts (the server's /health and /metrics)."""
        replicas = []
        for i, load in enumerate(self.router.loads):
            client = self.clients[i]
            replicas.append({"replica": i, "state": self.states[i], "pid": None if client is None else client.pid,
                             "outstanding_tokens": load.outstanding_tokens, "requests": load.requests,
                             "routed": load.routed, "restarts": self.restarts[i]})
        return {"replicas": replicas, "failovers": self.failovers, "resumed": self.resumed}


def _total(values: list):
    """One EngineStats field over the replicas: counts summed; per-position counts (speculative decoding's) summed
    position by position."""
    if values and isinstance(values[0], tuple):
        return tuple(map(sum, itertools.zip_longest(*values, fillvalue=0)))
    return sum(values)
