"""The one ops table: (mode, device type) -> the backend module that runs every op. See docs/CONTRACTS.md.

`deterministic` runs samebits' batch-invariant kernels, `fast` the vendor's ops. Every backend module defines the same
op set (OPS) with the same signatures, so a model holds one `Ops` and never asks which backend it got. A backend module
is imported the first time its row is asked for: only the Triton rows import triton.
"""
from __future__ import annotations

import functools
import importlib
from typing import Protocol

import torch
from torch import Tensor

from samebits.kernels.common import UnsupportedOpError
from samebits.modes import check_mode

BACKENDS = {
    ("deterministic", "cpu"): "samebits.kernels.cpu.backend",  # the proven MKL route, tree-ordered reductions
    ("deterministic", "cuda"): "samebits.kernels.triton.backend",  # Triton kernels, the proven cuBLASLt linears
    ("fast", "cpu"): "samebits.kernels.vendor",  # torch ops
    ("fast", "cuda"): "samebits.kernels.triton.fast",  # vendor GEMMs, Triton attention, norms, activation
}


class OpSet(Protocol):
    """The op set: what every backend module of BACKENDS defines and every `Ops` carries, with these arguments
    (docs/CONTRACTS.md: what each op guarantees in deterministic mode). A backend may name its parameters otherwise;
    callers pass them by position, as here."""

    mode: str
    device: torch.device
    deterministic: bool

    def linear(self, x: Tensor, weight: Tensor, bias: Tensor | None = None, /) -> Tensor:
        """x [..., K], weight [N, K] (F.linear layout) -> [..., N] in x.dtype."""

    def linear_fp8(self, x: Tensor, weight: Tensor, scale: Tensor, recipe, input_scale: Tensor | None = None,
                   bias: Tensor | None = None, /) -> Tensor:
        """x [..., K], weight [N, K] e4m3 with its scales and recipe (kernels/fp8.py) -> [..., N] in x.dtype."""

    def linear_partials(self, x: Tensor, weights: Tensor, /) -> Tensor:
        """x [M, C*Kc], weights [C, N, Kc] -> float32 [C, M, N]: x @ W^T's partial sums over C equal chunks of K."""

    def matmul(self, a: Tensor, b: Tensor, /) -> Tensor:
        """a [M, K] @ b [K, N] -> [M, N] in a.dtype."""

    def bmm(self, a: Tensor, b: Tensor, /) -> Tensor:
        """a [B, M, K] @ b [B, K, N] -> [B, M, N]."""

    def rms_norm(self, x: Tensor, weight: Tensor, eps: float, /) -> Tensor:
        """HF Llama's: normalised in fp32, rounded to x.dtype, scaled by the weight in x.dtype."""

    def add_rms_norm(self, x: Tensor, residual: Tensor, weight: Tensor, eps: float, /) -> tuple[Tensor, Tensor]:
        """-> (rms_norm(x + residual), x + residual), the sum rounded to x.dtype first."""

    def softmax(self, x: Tensor, dim: int = -1, /) -> Tensor:
        """fp32 softmax along dim."""

    def log_softmax(self, x: Tensor, dim: int = -1, /) -> Tensor:
        """fp32 log-softmax along dim."""

    def silu_and_mul(self, x: Tensor, /) -> Tensor:
        """x [..., 2I] -> silu(x[..., :I]) * x[..., I:] in x.dtype."""

    def det_sum_rows(self, x: Tensor, /) -> Tensor:
        """x [R, n] -> [R] fp32 row sums."""

    def rope(self, q: Tensor, k: Tensor, positions: Tensor, cos_sin: Tensor, /) -> tuple[Tensor, Tensor]:
        """q [T, Hq, D] and k [T, Hkv, D] rotated by their positions [T] (kernels/rope.py)."""

    def write_kv(self, k: Tensor, v: Tensor, k_cache: Tensor, v_cache: Tensor, slot_mapping: Tensor, /) -> None:
        """Keys and values [T, Hkv, D] stored at their slots, in place; slots < 0 skipped (kernels/kv_cache.py)."""

    def rope_write_kv(self, q: Tensor, k: Tensor, v: Tensor, positions: Tensor, cos_sin: Tensor, k_cache: Tensor,
                      v_cache: Tensor, slot_mapping: Tensor, /) -> Tensor:
        """rope, then write_kv of the rotated k and v; returns the rotated q (a backend may fuse the two)."""

    def attention(self, q: Tensor, k_cache: Tensor, v_cache: Tensor, meta, scale: float, /) -> Tensor:
        """Paged attention of q [T, Hq, D] over the cache by `meta` (kernels/attention.py AttentionMetadata)."""

    def philox_uniforms(self, seeds, sample_indices, positions, vocab_size: int, stream: int, /) -> Tensor:
        """[B, vocab_size] float32 uniforms keyed by (seed, sample index, position, stream) (kernels/philox.py)."""

    def gumbel_race(self, z: Tensor, seeds, sample_indices, positions, stream: int, /) -> tuple[Tensor, Tensor]:
        """-> (token int64 [S], its key float64 [S]): each row's draw, ties to the lowest id (kernels/race.py)."""

    def moe_topk(self, scores: Tensor, k: int, /) -> Tensor:
        """The k highest scores' expert ids per row, ties to the lower index (kernels/moe.py)."""

    def moe_experts(self, x: Tensor, w13: Tensor, w2: Tensor, ids: Tensor, weights: Tensor, /) -> Tensor:
        """Each token through its chosen experts, combined in rank order (kernels/moe.py)."""


OPS = tuple(name for name, member in vars(OpSet).items() if callable(member) and not name.startswith("_"))


class Ops(OpSet):
    """Every op of the backend of (mode, device type), as attributes: `ops.linear(x, w, bias)` and so on. Each is the
    backend's own function, set on the instance (no wrapper call per op); OpSet declares them."""

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
