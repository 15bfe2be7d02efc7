"""The ranks' process group: gloo on the CPU, NCCL on CUDA, opened without torch.distributed's global default group
(so one process can hold several engines, and nothing outlives the runner that opened it).

Rank 0 hosts the TCP rendezvous store; every collective carries the group's timeout, so a rank that stops answering
ends the step with an error instead of a hang (a rank that died is seen at once: gloo's socket closes).
"""
from __future__ import annotations

import datetime
from dataclasses import dataclass

import torch
import torch.distributed as dist

HOST = "127.0.0.1"  # one host: the ranks are this process and its children


def backend_for(device: torch.device) -> str:
    return "nccl" if device.type == "cuda" else "gloo"


def open_store(world: int, timeout_s: float, port: int = 0) -> dist.TCPStore:
    """Rank 0's rendezvous store on `port` (0: a free one, `store.port`), not waiting for the others to join."""
    return dist.TCPStore(HOST, port, world, True, timeout=datetime.timedelta(seconds=timeout_s),
                         wait_for_workers=False)


def join_store(port: int, world: int, timeout_s: float) -> dist.TCPStore:
    return dist.TCPStore(HOST, port, world, False, timeout=datetime.timedelta(seconds=timeout_s))


def run_ranks(target, world: int, args: tuple, timeout_s: float, join_s: float = 60.0):
    """`target(rank, world, port, *args, results)` in one spawned process per rank, rank 0 hosting the store on
    `port`; returns the first object a rank puts on `results`. Every rank is joined, or killed, before it returns."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:  # a free port for rank 0's store
        probe.bind((HOST, 0))
        port = probe.getsockname()[1]
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    procs = [ctx.Process(target=target, args=(r, world, port, *args, results), daemon=True) for r in range(world)]
    for p in procs:
        p.start()
    try:
        return results.get(timeout=timeout_s)
    finally:
        for p in procs:
            p.join(join_s)
            if p.is_alive():
                p.kill()


@dataclass
class Group:
    """rank of world ranks; `pg` is None at world 1 (the TP-invariant path of one rank needs no peers)."""

    rank: int
    world: int
    pg: object | None = None

    @classmethod
    def open(cls, store, rank: int, world: int, device: torch.device, start_s: float, timeout_s: float) -> Group:
        """Joins within start_s (the ranks connecting: imports and loading may take long); then every collective
        gets timeout_s."""
        if world == 1:
            return cls(0, 1)
        start = datetime.timedelta(seconds=start_s)
        if backend_for(device) == "gloo":
            pg = dist.ProcessGroupGloo(store, rank, world, start)
        else:
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = start
            pg = dist.ProcessGroupNCCL(store, rank, world, options)
        pg._set_default_timeout(datetime.timedelta(seconds=timeout_s))
        return cls(rank, world, pg)

    def all_gather(self, x: torch.Tensor) -> torch.Tensor:
        """[world, *x.shape]: every rank's x, in rank order."""
        if self.world == 1:
            return x[None]
        x = x.contiguous()
        out = x.new_empty(self.world * x.shape[0], *x.shape[1:])
        self.pg._allgather_base(out, x).wait()
        return out.view(self.world, *x.shape)

    def all_reduce_sum(self, x: torch.Tensor) -> torch.Tensor:
        """The library's own sum (NCCL's algorithm, gloo's ring): its order is not ours (the route `native`)."""
        if self.world == 1:
            return x
        x = x.contiguous()
        self.pg.allreduce([x]).wait()
        return x

    def close(self) -> None:
        if self.pg is not None and hasattr(self.pg, "shutdown"):
            self.pg.shutdown()
        self.pg = None
