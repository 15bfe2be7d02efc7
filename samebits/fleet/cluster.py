"""Ray's side of a fleet: the cluster joined (`ray_address`) or started here, the replica actors placed on it with
their resources, and ended with the fleet. Ray restarts a replica whose process dies (`MAX_RESTARTS`)."""
from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from samebits.engine.config import EngineConfig

# A replica that dies is started again by Ray, as often as it dies: the fleet admits it back only with the fleet's
# fingerprint (engine.py), so a replica that keeps failing costs restarts, never an answer.
MAX_RESTARTS = -1


def connect(address: str | None, num_cpus: int | None = None) -> dict | None:
    """Join the cluster at `address`, or start one on this machine (of `num_cpus`; None: all). None if Ray was
    already running in this process (its owner ends it); else what ray.init changes in this process (environment
    variables, sys.path, the SIGTERM handler; importing ray, the first time) as it was, for `disconnect` to put back."""
    before = {"environ": dict(os.environ), "path": list(sys.path), "sigterm": signal.getsignal(signal.SIGTERM)}
    import ray  # its first import puts its vendored packages on sys.path

    if ray.is_initialized():
        return None
    ray.init(address=address, num_cpus=num_cpus, include_dashboard=False, log_to_driver=False, configure_logging=False)
    return before


def disconnect(before: dict | None) -> None:
    """Shut Ray down in this process and put back what `connect` found."""
    if before is None:
        return
    import ray

    ray.shutdown()
    os.environ.clear()
    os.environ.update(before["environ"])
    sys.path[:] = before["path"]
    if threading.current_thread() is threading.main_thread():
        signal.signal(signal.SIGTERM, before["sigterm"])


def replica_threads(replicas: int) -> int:
    """Each replica's share of the cluster's CPUs (its torch threads and its Ray CPU reservation)."""
    import ray

    return max(1, int(ray.cluster_resources().get("CPU", 1)) // replicas)


def spawn(config: EngineConfig, threads: int, make_engine=None):
    """One replica actor: one GPU on CUDA, `threads` CPUs either way. Its engine config is the fleet's, one replica
    of it, on the device type alone (Ray picks the GPU)."""
    import ray

    from samebits.fleet.replica import MAX_CONCURRENCY, Replica
    from samebits.models.loader import default_device

    device = (config.device or default_device()).split(":")[0]
    replica = config.replace(data_parallel_size=1, data_parallel_backend=None, ray_address=None, device=device)
    actor = ray.remote(Replica).options(num_cpus=threads, num_gpus=1 if device == "cuda" else 0,
                                        max_restarts=MAX_RESTARTS, max_concurrency=MAX_CONCURRENCY)
    return actor.remote(replica, threads, make_engine)


def ready(actor, timeout_s: float) -> tuple:
    """The actor's `ready()` answer, once its engine has loaded."""
    import ray

    return ray.get(actor.ready.remote(timeout_s), timeout=timeout_s + 10)


def pid(actor) -> int:
    """The replica's process id (a test kills it to prove failover)."""
    import ray

    return ray.get(actor.pid.remote(), timeout=30)


def kill(actor, restart: bool) -> None:
    import ray

    with contextlib.suppress(Exception):  # already gone
        ray.kill(actor, no_restart=not restart)
