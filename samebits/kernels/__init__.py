"""samebits.kernels: the ops a model runs on, one backend per (mode, device type) in one table (`ops.py`).

    kernels/ops.py       the table and `get_ops(mode, device)`
    kernels/cpu/         deterministic on the CPU (the proven MKL route)
    kernels/triton/      deterministic on CUDA (Triton kernels, the proven cuBLASLt linears), and fast mode's CUDA row
    kernels/vendor.py    fast mode: torch ops

The functions below are the deterministic ops of a tensor's device, for callers that hold no ops table (drop-in mode,
tests, probes). Unsupported dtype/device raises UnsupportedOpError naming op, dtype, device and shape.
"""
from __future__ import annotations

from samebits.kernels.common import UnsupportedOpError, require
from samebits.kernels.ops import Ops, get_ops

__all__ = [
    "Ops",
    "UnsupportedOpError",
    "add_rms_norm",
    "det_mean",
    "det_sum",
    "get_ops",
    "gumbel_race",
    "linear",
    "log_softmax",
    "matmul",
    "philox_uniforms",
    "rms_norm",
    "silu_and_mul",
    "softmax",
]


def _det(x) -> Ops:
    return get_ops("deterministic", x.device)


def linear(x, weight, bias=None):
    """x [..., K], weight [N, K], bias [N] or None -> [..., N] in x.dtype."""
    return _det(x).linear(x, weight, bias)


def matmul(a, b):
    """a [M, K] @ b [K, N] -> [M, N] in a.dtype."""
    return _det(a).matmul(a, b)


def rms_norm(x, weight, eps=1e-6):
    """x [..., H], weight [H] -> [..., H] in x.dtype (HF Llama semantics: fp32 normalise, round, scale)."""
    return _det(x).rms_norm(x, weight, eps)


def add_rms_norm(x, residual, weight, eps=1e-6):
    """-> (rms_norm(x + residual), x + residual), the sum rounded to x.dtype."""
    return _det(x).add_rms_norm(x, residual, weight, eps)


def softmax(x, dim=-1):
    """fp32 softmax along dim."""
    return _det(x).softmax(x, dim)


def log_softmax(x, dim=-1):
    """fp32 log_softmax along dim."""
    return _det(x).log_softmax(x, dim)


def silu_and_mul(x):
    """x [T, 2I] -> silu(x[:, :I]) * x[:, I:] in x.dtype, computed in fp32 (on CPU spelled with exp: see kernels/cpu)."""
    return _det(x).silu_and_mul(x)


def _sum_rows(x, dim):
    # -> (fp32 [R] sums of rows along dim, output shape, n summed); dim None sums everything.
    if dim is None:
        rows, shape = x.reshape(1, -1), ()
    else:
        xt = x.movedim(dim, -1)
        rows, shape = xt.reshape(-1, xt.shape[-1]), xt.shape[:-1]
    return _det(x).det_sum_rows(rows), shape, rows.shape[1]


def det_sum(x, dim=None):
    """Two-stage deterministic sum (fp32 accumulation) over all elements or one dim; result in x.dtype."""
    require("det_sum", x)
    s, shape, _ = _sum_rows(x, dim)
    return s.reshape(shape).to(x.dtype)


def det_mean(x, dim=None):
    """det_sum / n, divided in fp32 before rounding to x.dtype."""
    require("det_mean", x)
    s, shape, n = _sum_rows(x, dim)
    return (s / n).reshape(shape).to(x.dtype)


def philox_uniforms(seeds, sample_indices, positions, vocab_size: int, stream: int):
    """[B, vocab_size] float32 Philox uniforms (int64 [B] counters on one device). Integer arithmetic: one implementation
    per device serves both modes, with the same bits on every device."""
    return _det(seeds).philox_uniforms(seeds, sample_indices, positions, vocab_size, stream)


def gumbel_race(z, seeds, sample_indices, positions, stream: int):
    """-> (token int64 [S], its float64 key [S]): the exponential race over z [S, V] float32 with the Philox uniforms
    of each row's counters (kernels/race.py). Elementwise keys and an exact maximum: one implementation per device
    serves both modes."""
    return _det(z).gumbel_race(z, seeds, sample_indices, positions, stream)
