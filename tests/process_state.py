"""The process-global state a test may change only if it puts it back: a test that leaves an environment variable,
a sys.path entry, a torch flag, MKL's threads or a signal handler behind changes what every later test computes, and
the suite then passes or fails by its order (pytest-randomly shuffles it). tests/conftest.py checks every test and
every test module with `kept`; `snapshot` names each fact so a failure says which one moved."""
from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager

import pytest
import torch

from samebits.kernels import dropin
from samebits.kernels.cpu import mkl

# SIGALRM is pytest-timeout's, set around each test.
_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGCHLD, signal.SIGPIPE, signal.SIGUSR1,
            signal.SIGUSR2)

_PYTEST_OWN = "PYTEST_CURRENT_TEST"  # pytest sets it for each phase of each test


def _cuda_flags() -> dict:
    b = torch.backends
    return {"cuda.matmul.allow_tf32": b.cuda.matmul.allow_tf32,
            "cuda.matmul.allow_fp16_reduced_precision_reduction":
                b.cuda.matmul.allow_fp16_reduced_precision_reduction,
            "cuda.matmul.allow_bf16_reduced_precision_reduction":
                b.cuda.matmul.allow_bf16_reduced_precision_reduction,
            "cudnn.allow_tf32": b.cudnn.allow_tf32, "cudnn.deterministic": b.cudnn.deterministic,
            "cudnn.benchmark": b.cudnn.benchmark, "cudnn.enabled": b.cudnn.enabled}


# name -> (read the fact, put a read value back); None: it can only be reported.
FACTS: dict[str, tuple[Callable[[], object], Callable[[object], None] | None]] = {
    "sys.path": (lambda: list(sys.path), lambda v: sys.path.__setitem__(slice(None), v)),
    "os.environ": (lambda: {k: v for k, v in os.environ.items() if k != _PYTEST_OWN},
                   lambda v: (os.environ.clear(), os.environ.update(v))),
    "working directory": (os.getcwd, os.chdir),
    "signal handlers": (lambda: {s.name: signal.getsignal(s) for s in _SIGNALS},
                        lambda v: [signal.signal(getattr(signal, n), h) for n, h in v.items() if h is not None]),
    "torch default dtype": (torch.get_default_dtype, torch.set_default_dtype),
    "torch threads": (torch.get_num_threads, torch.set_num_threads),
    "torch grad mode": (torch.is_grad_enabled, torch.set_grad_enabled),
    "torch deterministic algorithms": (
        lambda: (torch.are_deterministic_algorithms_enabled(),
                 torch.is_deterministic_algorithms_warn_only_enabled()),
        lambda v: torch.use_deterministic_algorithms(v[0], warn_only=v[1])),
    "torch float32 matmul precision": (torch.get_float32_matmul_precision, torch.set_float32_matmul_precision),
    "torch backend flags": (_cuda_flags, None),
    "MKL threads": (mkl.threads, None),
    "MKL reproducible mode": (mkl.cnr_mode, None),
    "samebits.batch_invariant() mode": (dropin.active, None),
}


def snapshot() -> dict:
    return {name: read() for name, (read, _) in FACTS.items()}


def changes(before: dict, after: dict) -> list[str]:
    """One line per fact that differs, saying how (for dicts: the keys added, removed or changed)."""
    out = []
    for name in FACTS:
        a, b = before[name], after[name]
        if a == b:
            continue
        if isinstance(a, dict) and isinstance(b, dict):
            keys = sorted(k for k in a.keys() | b.keys() if a.get(k, KeyError) != b.get(k, KeyError))
            out.append(f"{name}: {', '.join(map(str, keys))}")
        else:
            out.append(f"{name}: {a!r} -> {b!r}")
    return out


def restore(before: dict) -> None:
    for name, (_, put) in FACTS.items():
        if put is not None:
            put(before[name])


@contextmanager
def kept(what: str) -> Iterator[None]:
    """Fail `what` (a test or a module) if it leaves any fact changed; put the facts back first, so one leak fails
    one test rather than every test after it."""
    before = snapshot()
    yield
    moved = changes(before, snapshot())
    if moved:
        restore(before)
        pytest.fail(f"{what} left process-global state changed (restore it, e.g. with monkeypatch): "
                    + "; ".join(moved), pytrace=False)
