"""A worker rank's process (ranks 1..N-1; rank 0 is the engine's own process, runner.py).

It joins the group, builds its shard, answers "ready", then runs every step rank 0 sends down its pipe. It ends when
rank 0 says so (None), when the pipe closes (rank 0 is gone, however it died) or when a collective fails (a peer died,
or the timeout passed): nothing waits forever. Ctrl-C is rank 0's to handle: the worker ignores SIGINT and ends with
the pipe. An error is sent up the pipe before the process exits, so rank 0 can say what happened.
"""
from __future__ import annotations

import contextlib
import signal
import traceback

import torch

from samebits.distributed.group import Group, join_store
from samebits.distributed.rank import Rank, RankSpec
from samebits.runtime import runtime_for


def device_of(base: torch.device, rank: int) -> torch.device:
    """Rank r's device: the r-th GPU counted from rank 0's, or the CPU."""
    if base.type != "cuda":
        return torch.device("cpu")
    return torch.device("cuda", (base.index or 0) + rank)


def main(rank: int, spec: RankSpec, base_device: str, port: int, state: dict, conn) -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        with runtime_for(spec.mode):
            _serve(rank, spec, device_of(torch.device(base_device), rank), port, state, conn)
    except Exception:  # noqa: BLE001 - anything that ends a worker is reported to rank 0, then the process ends
        with contextlib.suppress(OSError):
            conn.send(("error", f"rank {rank}: {traceback.format_exc()}"))
        raise SystemExit(1) from None


def _serve(rank: int, spec: RankSpec, device: torch.device, port: int, state: dict, conn) -> None:
    torch.set_num_threads(spec.threads)
    if device.type == "cuda":
        torch.cuda.set_device(device)
    store = join_store(port, spec.world, spec.start_s)
    group = Group.open(store, rank, spec.world, device, spec.start_s, spec.timeout_s)
    worker = Rank(spec, rank, device, group, state)
    del state
    conn.send(("ready", None))
    while True:
        try:
            message = conn.recv()
        except EOFError:
            break
        if message is None:
            break
        kind, payload = message
        if kind == "step":
            worker.run(payload)
        else:
            worker.set_ops(payload)
    group.close()
