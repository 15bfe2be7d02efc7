"""The deterministic backend on the CPU (the table's ("deterministic", "cpu") row).

- GEMMs go through the proven route (`gemm.py`): MKL called only on fixed row blocks that a self-test in this process
  showed to give every row the same bits.
- Row reductions (norms, softmax, sums) add in an order written here (`reduce.tree_sum`); maxima are exact in any order.
- Everything else is elementwise, computed in float32 and rounded once to the input dtype. Elementwise kernels are
  invariant only where their vector body and their scalar tail agree: torch's sigmoid/silu do not (a tail element gets
  other bits, and where a tail falls follows the tensor's size and the thread split), so silu is spelled out with exp,
  which agrees (measured: tests/kernels/test_cpu_invariance.py).
- Mixtures of experts: one expert at a time through the proven `linear` (kernels/moe.py `experts_by_loop`), so a
  token's expert output is that of the rows it landed among in a proven block, whatever the expert's load.
- Attention: the two-pass tiled kernel of `attention.py`; RoPE, KV writes and Philox are the torch ops of kernels/
  (elementwise, copies, integer arithmetic: invariant as written).
Ops that drop-in mode overrides are called here only through forms it leaves alone (out= overloads, other ops).
"""
from __future__ import annotations

import torch

from samebits.kernels import common, moe
from samebits.kernels.attention import run_checked
from samebits.kernels.cpu.attention import paged_attention_cpu
from samebits.kernels.cpu.fp8 import linear_fp8  # noqa: F401 - an op of this backend (ops.OPS)
from samebits.kernels.cpu.gemm import blocked_gemm
from samebits.kernels.cpu.reduce import tree_sum
from samebits.kernels.kv_cache import write_kv  # noqa: F401 - ops of this backend (ops.OPS)
from samebits.kernels.philox import philox_uniforms  # noqa: F401
from samebits.kernels.race import gumbel_race  # noqa: F401
from samebits.kernels.rope import apply_rope as rope  # noqa: F401
from samebits.kernels.rope import rope_write_kv  # noqa: F401
from samebits.kernels.vector_math import settle


def linear(x, weight, bias=None):
    """x [..., K], weight [N, K] (F.linear layout) -> [..., N] in x.dtype; the bias is added in fp32 before rounding."""
    common.check_linear(x, weight, bias)
    k = x.shape[-1]
    y = blocked_gemm(x.reshape(-1, k), weight)[:, :weight.shape[0]]
    if bias is not None:
        y = y + bias.float()
    return y.to(x.dtype).reshape(*x.shape[:-1], weight.shape[0])


def linear_partials(x, weights):
    """x [M, C*Kc], weights [C, N, Kc] -> float32 [C, M, N]: the partial sums of x @ W^T over K cut into C equal
    chunks, each one proven GEMM of its own (what a row-parallel shard of 1/C of K computes; distributed/reduce.py
    merges them)."""
    common.check_linear_partials(x, weights)
    c, n, kc = weights.shape
    return torch.stack([blocked_gemm(x[:, i * kc:(i + 1) * kc], weights[i])[:, :n] for i in range(c)])


def matmul(a, b):
    """a [M, K] @ b [K, N] -> [M, N] in a.dtype (b is laid out as [N, K] once, the route's one layout)."""
    common.check_matmul(a, b)
    return blocked_gemm(a, b.t().contiguous())[:, :b.shape[1]].to(a.dtype)


def bmm(a, b):
    """a [B, M, K] @ b [B, K, N] -> [B, M, N]: one proven GEMM per batch entry."""
    return common.per_entry(matmul, a, b)


def rms_norm(x, weight, eps):
    """HF Llama semantics: normalise in fp32, round to x.dtype, then scale by the weight in x.dtype."""
    common.check_rms_norm(x, weight)
    return _rms_norm(x, weight, eps)


def _rms_norm(x, weight, eps):
    settle()
    xf = x.float()
    var = tree_sum(xf * xf) / x.shape[-1]
    y = (xf * torch.rsqrt(var + eps)[..., None]).to(x.dtype)
    return y * weight.to(x.dtype)


def add_rms_norm(x, residual, weight, eps):
    """-> (rms_norm(x + residual), x + residual); the sum is rounded to x.dtype first, as an unfused model does."""
    common.check_add_rms_norm(x, residual, weight)
    s = x + residual
    return _rms_norm(s, weight, eps), s


def softmax(x, dim=-1):
    """fp32 softmax along dim."""
    common.require("softmax", x)
    return _softmax(x, dim, log=False)


def log_softmax(x, dim=-1):
    common.require("log_softmax", x)
    return _softmax(x, dim, log=True)


def _softmax(x, dim, log):
    settle()
    xt = x.movedim(dim, -1).float()
    if xt.numel() == 0:
        return xt.movedim(-1, dim)
    m = xt.amax(dim=-1, keepdim=True)
    e = torch.exp(xt - m)
    s = tree_sum(e)[..., None]
    y = xt - m - torch.log(s) if log else e / s
    return y.movedim(-1, dim)


def det_sum_rows(x):
    """x [R, n] -> [R] fp32 row sums in the tree order (a function of n alone)."""
    common.require("det_sum_rows", x)
    return tree_sum(x)


def _silu_fp32(x):
    settle()
    return x / (1.0 + torch.exp(-x))


def silu(x):
    """x / (1 + exp(-x)) in fp32, rounded to x.dtype."""
    return _silu_fp32(x.float()).to(x.dtype)


def silu_and_mul(x):
    """x [..., 2I] -> silu(x[..., :I]) * x[..., I:] in x.dtype, computed in fp32."""
    common.require("silu_and_mul", x)
    i = x.shape[-1] // 2
    xf = x.float()
    return (_silu_fp32(xf[..., :i]) * xf[..., i:]).to(x.dtype)


def attention(q, k_cache, v_cache, meta, scale):
    return run_checked(paged_attention_cpu, "deterministic", q, k_cache, v_cache, meta, scale)


def moe_topk(scores, k):
    """The k highest scores per row, ties to the lower expert index (an exact order: kernels/moe.py)."""
    common.require("moe_topk", scores)
    return moe.topk_ids(scores, k)


def moe_experts(x, w13, w2, ids, weights):
    moe.check_experts(x, w13, w2, ids, weights)
    common.require("moe_experts", x, w13, w2)
    return moe.experts_by_loop(x, w13, w2, ids, weights, linear, silu_and_mul)
