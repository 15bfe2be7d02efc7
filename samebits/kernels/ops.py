"""The one ops table: (mode, device type) -> the backend module that runs every op. See docs/CONTRACTS.md.

`deterministic` runs samebits' batch-invariant kernels, `fast` the vendor's ops. Every backend module defines the same
op set (OPS) with the same signatures, so a model holds one `Ops` and never asks which backend it got. A backend module
is imported the first time its row is asked for: only the Triton rows import triton.
"""
from __future__ import annotations

import functools
import importlib

import torch

from samebits.kernels.common import UnsupportedOpError
from samebits.modes import check_mode

BACKENDS = {
    ("deterministic", "cpu"): "samebits.kernels.cpu.backend",  # the proven MKL route, tree-ordered reductions
    ("deterministic", "cuda"): "samebits.kernels.triton.backend",  # Triton kernels, the proven cuBLASLt linears
    ("fast", "cpu"): "samebits.kernels.vendor",  # torch ops
    ("fast", "cuda"): "samebits.kernels.triton.fast",  # vendor GEMMs, Triton attention, norms, activation
}
OPS = ("linear", "linear_fp8", "linear_partials", "matmul", "bmm", "rms_norm", "add_rms_norm", "softmax", "log_softmax", "silu_and_mul",
       "det_sum_rows", "rope", "write_kv", "rope_write_kv", "attention", "philox_uniforms",
       "gumbel_race", "moe_topk", "moe_experts")


class Ops:
    """Every op of the backend of (mode, device type), as attributes: `ops.linear(x, w, bias)` and so on."""

    def __init__(self, mode: str, device):
        self.mode = check_mode(mode)
        self.device = torch.device(device)
        self.deterministic = mode == "deterministic"
        key = (mode, self.device.type)
        if key not in BACKENDS:
            raise UnsupportedOpError(f"samebits get_ops: no {mode} backend for device={self.device} "
                                     f"(backends: {sorted(BACKENDS)}); refusing to fall back")
        self.backend = importlib.import_module(BACKENDS[key])
        for name in OPS:
            setattr(self, name, getattr(self.backend, name))

    def __repr__(self) -> str:
        return f"Ops(mode={self.mode!r}, device={str(self.device)!r}, backend={self.backend.__name__!r})"


@functools.cache
def _cached(mode: str, device: torch.device) -> Ops:
    return Ops(mode, device)


def get_ops(mode: str, device) -> Ops:
    """The ops of (mode, device); one shared, read-only instance per pair."""
    check_mode(mode)
    return _cached(mode, torch.device(device))
