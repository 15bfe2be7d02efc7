"""The batch-invariant CPU path.

- GEMMs go through the proven route (`gemm.py`): MKL called only on fixed row blocks that a self-test in this process
  showed to give every row the same bits.
- Row reductions (norms, softmax, sums) add in an order written here (`reduce.tree_sum`); maxima are exact in any order.
- Everything else is elementwise, computed in float32 and rounded once to the input dtype. Elementwise kernels are
  invariant only where their vector body and their scalar tail agree: torch's sigmoid/silu do not (a tail element gets
  other bits, and where a tail falls follows the tensor's size and the thread split), so silu is spelled out with exp,
  which agrees (measured: tests/kernels/test_cpu_invariance.py).
Ops that drop-in mode overrides are called here only through forms it leaves alone (out= overloads, other ops).
"""
from __future__ import annotations

import torch

from samebits.kernels.cpu.gemm import blocked_gemm
from samebits.kernels.cpu.reduce import tree_sum


def linear(x, weight, bias=None):
    """x [..., K], weight [N, K] (F.linear layout) -> [..., N] in x.dtype; the bias is added in fp32 before rounding."""
    k = x.shape[-1]
    y = blocked_gemm(x.reshape(-1, k), weight)[:, :weight.shape[0]]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def matmul(a, b):
    """a [M, K] @ b [K, N] -> [M, N] in a.dtype (b is laid out as [N, K] once, the route's one layout)."""
    return blocked_gemm(a, b.t().contiguous())[:, :b.shape[1]].to(a.dtype)


def bmm(a, b):
    """a [B, M, K] @ b [B, K, N] -> [B, M, N]: one proven GEMM per batch entry, so an entry never sees its batch."""
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
    for i in range(a.shape[0]):
        out[i] = matmul(a[i], b[i])
    return out


def rms_norm(x, weight, eps):
    """HF Llama semantics: normalise in fp32, round to x.dtype, then scale by the weight in x.dtype."""
    xf = x.float()
    var = tree_sum(xf * xf) / x.shape[-1]
    y = (xf * torch.rsqrt(var + eps)[..., None]).to(x.dtype)
    return y * weight.to(x.dtype)


def add_rms_norm(x, residual, weight, eps):
    """-> (rms_norm(x + residual), x + residual); the sum is rounded to x.dtype first, as an unfused model does."""
    s = x + residual
    return rms_norm(s, weight, eps), s


def softmax(x, dim=-1, log=False):
    """fp32 softmax (or log_softmax) along dim."""
    xt = x.movedim(dim, -1).float()
    if xt.numel() == 0:
        return xt.movedim(-1, dim)
    m = xt.amax(dim=-1, keepdim=True)
    e = torch.exp(xt - m)
    s = tree_sum(e)[..., None]
    y = xt - m - torch.log(s) if log else e / s
    return y.movedim(-1, dim)


def log_softmax(x, dim=-1):
    return softmax(x, dim, log=True)


def det_sum_rows(x):
    """x [R, n] -> [R] fp32 row sums in the tree order (a function of n alone)."""
    return tree_sum(x)


def _silu_fp32(x):
    return x / (1.0 + torch.exp(-x))


def silu(x):
    """x / (1 + exp(-x)) in fp32, rounded to x.dtype."""
    return _silu_fp32(x.float()).to(x.dtype)


def silu_and_mul(x):
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:] in x.dtype, computed in fp32."""
    i = x.shape[-1] // 2
    xf = x.float()
    return (_silu_fp32(xf[..., :i]) * xf[..., i:]).to(x.dtype)
