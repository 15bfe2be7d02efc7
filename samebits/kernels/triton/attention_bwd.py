"""Triton causal attention backward over whole packed sequences: FlashAttention-2's two passes, no float atomic.

The RL trainer's attention (rl/train_ops.py) runs the engine's forward kernel (attention.py), which keeps no
logsumexp; the dQ pass recomputes it, one Q K^T pass over the row's keys before the gradient pass (the forward's own m
and l are not needed: the logsumexp only has to normalise P to fp32 accuracy). Two kernels, each output element
written by exactly one program that adds its terms in a fixed order (configs.py, attention.backward):

- `_attention_dq_kernel`, one program per (query block, sequence, query head): the logsumexp and delta = rowsum(dO * O)
  of its rows, then dQ += dS K over the key blocks 0..diagonal in order; it stores dQ, the logsumexp and delta;
- `_attention_dkdv_kernel`, one program per (key block, sequence, KV head): for each query head of the group in
  order, over the query blocks diagonal..end in order, dV += P^T dO and dK += dS^T Q.

Tiles start at each sequence's first token and read only its rows (cu_seqlens), so a sequence's gradient is the
same bits whatever is packed beside it; fp32 accumulation, P and dS rounded to the input dtype for the MMAs (as
FlashAttention does), gradients stored in the input dtype. Memory: the [T, Hq] fp32 logsumexp and delta, no score
matrix. Torch reference: kernels.grads.attention_bwd (dense, per sequence).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.arith import cdiv
from samebits.kernels.common import interpreting
from samebits.kernels.configs import LAUNCH, TILE_CONFIGS
from samebits.kernels.triton.attention import LOG2E
from samebits.kernels.triton.mma import mma

_CFG = TILE_CONFIGS["attention.backward"]["config"]
HEAD_DIMS = tuple(int(d) for d in _CFG["tiles"])


@triton.jit
def _sequence(cu_seqlens, b):
    start = tl.load(cu_seqlens + b)
    return start, tl.load(cu_seqlens + b + 1) - start


@triton.jit
def _rows(base, start, idx, n, h, stride_t, stride_h, D: tl.constexpr):
    # [len(idx), D] of head h at the sequence's rows idx; rows at or past n read 0.
    d = tl.arange(0, D)
    ptrs = base + (start + idx).to(tl.int64)[:, None] * stride_t + h * stride_h + d[None, :]
    return tl.load(ptrs, mask=(idx < n)[:, None], other=0.0)


@triton.jit
def _store_rows(base, start, idx, n, h, stride_t, stride_h, x, D: tl.constexpr):
    d = tl.arange(0, D)
    ptrs = base + (start + idx).to(tl.int64)[:, None] * stride_t + h * stride_h + d[None, :]
    tl.store(ptrs, x.to(base.dtype.element_ty), mask=(idx < n)[:, None])


@triton.jit
def _operand(x, UPCAST: tl.constexpr):
    # The interpreter's bf16 arithmetic is not the GPU's: it computes in fp32 (kernels/triton/mma.py).
    if UPCAST:
        x = x.to(tl.float32)
    return x


@triton.jit
def _attention_dq_kernel(Q, K, V, O, DO, DQ, LSE, DELTA, cu_seqlens, qk_scale, scale, num_q_heads,
                         stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_ot, stride_oh,
                         stride_dot, stride_doh, stride_dqt, stride_dqh,
                         G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, UPCAST: tl.constexpr,
                         PRECISION: tl.constexpr):
    # grid (query blocks, B, Hq); the last blocks (the most keys) first. Scores in the log2 domain (qk_scale =
    # scale * log2 e), so P = exp2(S - lse) with lse the log2-domain logsumexp.
    m0 = (tl.num_programs(0) - 1 - tl.program_id(0)) * BM
    b = tl.program_id(1)
    h = tl.program_id(2)
    start, n = _sequence(cu_seqlens, b)
    if m0 < n:
        rows = m0 + tl.arange(0, BM)
        q = _operand(_rows(Q, start, rows, n, h, stride_qt, stride_qh, D), UPCAST)
        do = _rows(DO, start, rows, n, h, stride_dot, stride_doh, D)
        o = _rows(O, start, rows, n, h, stride_ot, stride_oh, D)
        delta = tl.sum(do.to(tl.float32) * o.to(tl.float32), 1)
        do = _operand(do, UPCAST)
        hi = tl.minimum(m0 + BM, n)
        m_i = tl.full([BM], float("-inf"), tl.float32)
        l_i = tl.zeros([BM], tl.float32)
        for n0 in range(0, hi, BN):
            cols = n0 + tl.arange(0, BN)
            k = _operand(_rows(K, start, cols, n, h // G, stride_kt, stride_kh, D), UPCAST)
            s = mma(q, tl.trans(k), None, UPCAST, PRECISION) * qk_scale
            s = tl.where(cols[None, :] <= rows[:, None], s, float("-inf"))
            m_new = tl.maximum(m_i, tl.max(s, 1))
            l_i = l_i * tl.exp2(m_i - m_new) + tl.sum(tl.exp2(s - m_new[:, None]), 1)
            m_i = m_new
        lse = m_i + tl.log2(l_i)
        dq = tl.zeros([BM, D], tl.float32)
        for n0 in range(0, hi, BN):
            cols = n0 + tl.arange(0, BN)
            k = _operand(_rows(K, start, cols, n, h // G, stride_kt, stride_kh, D), UPCAST)
            v = _operand(_rows(V, start, cols, n, h // G, stride_vt, stride_vh, D), UPCAST)
            s = mma(q, tl.trans(k), None, UPCAST, PRECISION) * qk_scale
            p = tl.where(cols[None, :] <= rows[:, None], tl.exp2(s - lse[:, None]), 0.0)
            dp = mma(do, tl.trans(v), None, UPCAST, PRECISION)
            ds = p * (dp - delta[:, None])
            dq = mma(ds.to(k.dtype), k, dq, UPCAST, PRECISION)
        _store_rows(DQ, start, rows, n, h, stride_dqt, stride_dqh, dq * scale, D)
        ok = rows < n
        at = (start + rows).to(tl.int64) * num_q_heads + h
        tl.store(LSE + at, lse, mask=ok)
        tl.store(DELTA + at, delta, mask=ok)


@triton.jit
def dkdv_tile(k, v, dk, dv, Q, DO, LSE, DELTA, start, n, cols, m0, h, qk_scale, num_q_heads,
              stride_qt, stride_qh, stride_dot, stride_doh,
              D: tl.constexpr, BM: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    # One query block's terms for a key block: (dk, dv) updated, and dS^T [BN, BM] (scaled scores' gradient).
    rows = m0 + tl.arange(0, BM)
    ok = rows < n
    q = _operand(_rows(Q, start, rows, n, h, stride_qt, stride_qh, D), UPCAST)
    do = _operand(_rows(DO, start, rows, n, h, stride_dot, stride_doh, D), UPCAST)
    at = (start + rows).to(tl.int64) * num_q_heads + h
    lse = tl.load(LSE + at, mask=ok, other=0.0)
    delta = tl.load(DELTA + at, mask=ok, other=0.0)
    st = mma(k, tl.trans(q), None, UPCAST, PRECISION) * qk_scale  # S^T [BN, BM]
    seen = (cols[:, None] <= rows[None, :]) & ok[None, :]
    pt = tl.where(seen, tl.exp2(st - lse[None, :]), 0.0)
    dv = mma(pt.to(do.dtype), do, dv, UPCAST, PRECISION)
    dpt = mma(v, tl.trans(do), None, UPCAST, PRECISION)
    dst = pt * (dpt - delta[None, :])
    dk = mma(dst.to(q.dtype), q, dk, UPCAST, PRECISION)
    return dk, dv, dst


@triton.jit
def _attention_dkdv_kernel(Q, K, V, DO, DK, DV, LSE, DELTA, cu_seqlens, qk_scale, scale, num_q_heads,
                           stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
                           stride_dkt, stride_dkh, stride_dvt, stride_dvh,
                           G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                           UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    # grid (key blocks, B, Hkv); the first blocks (the most queries) first.
    n0 = tl.program_id(0) * BN
    b = tl.program_id(1)
    hk = tl.program_id(2)
    start, n = _sequence(cu_seqlens, b)
    if n0 < n:
        cols = n0 + tl.arange(0, BN)
        k = _operand(_rows(K, start, cols, n, hk, stride_kt, stride_kh, D), UPCAST)
        v = _operand(_rows(V, start, cols, n, hk, stride_vt, stride_vh, D), UPCAST)
        dk = tl.zeros([BN, D], tl.float32)
        dv = tl.zeros([BN, D], tl.float32)
        for g in range(G):
            for m0 in range(n0 // BM * BM, n, BM):
                dk, dv, _ = dkdv_tile(k, v, dk, dv, Q, DO, LSE, DELTA, start, n, cols, m0, hk * G + g, qk_scale,
                                         num_q_heads, stride_qt, stride_qh, stride_dot, stride_doh, D, BM, UPCAST,
                                         PRECISION)
        _store_rows(DK, start, cols, n, hk, stride_dkt, stride_dkh, dk * scale, D)
        _store_rows(DV, start, cols, n, hk, stride_dvt, stride_dvh, dv, D)


def tiles(d: int) -> list[int]:
    """[BM, BN, num_warps, num_stages] for head dim d."""
    return _CFG["tiles"][str(d)]


def check(q, k, v, o, do, cu_seqlens) -> None:
    what = f"attention_bwd[triton](q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)}, v {tuple(v.shape)})"
    assert q.dim() == 3 and k.shape == v.shape and k.shape[0] == q.shape[0] and k.shape[2] == q.shape[2], \
        f"{what}: need q [T, Hq, D], k and v [T, Hkv, D]"
    assert q.shape[1] % k.shape[1] == 0, f"{what}: Hq must be a multiple of Hkv"
    assert q.shape[2] in HEAD_DIMS, f"{what}: head_dim must be one of {HEAD_DIMS}"
    assert o.shape == q.shape and do.shape == q.shape, f"{what}: o {tuple(o.shape)}, do {tuple(do.shape)}"
    assert all(t.dtype == q.dtype and t.device == q.device for t in (k, v, o, do)), f"{what}: one dtype and device"
    assert all(t.stride(2) == 1 for t in (q, k, v, o, do)), f"{what}: head dims must be contiguous"
    assert cu_seqlens.dtype == torch.int32 and cu_seqlens.device == q.device, f"{what}: cu_seqlens int32 on q's device"


def launch_dq(q, k, v, o, do, cu_seqlens, max_len: int, scale: float):
    """The dQ pass -> (dq, lse [T, Hq] fp32 log2-domain, delta [T, Hq] fp32)."""
    t, hq, d = q.shape
    bm, bn, warps, stages = tiles(d)
    dq = torch.empty_like(q)
    lse = torch.empty(t, hq, dtype=torch.float32, device=q.device)
    delta = torch.empty_like(lse)
    upcast = interpreting()
    precision = "ieee" if upcast or q.dtype == torch.float32 else "tf32"
    _attention_dq_kernel[(cdiv(max_len, bm), cu_seqlens.numel() - 1, hq)](
        q, k, v, o, do, dq, lse, delta, cu_seqlens, float(scale) * LOG2E, float(scale), hq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), o.stride(0), o.stride(1),
        do.stride(0), do.stride(1), dq.stride(0), dq.stride(1),
        G=hq // k.shape[1], D=d, BM=bm, BN=bn, UPCAST=upcast, PRECISION=precision, num_warps=warps,
        num_stages=stages, **LAUNCH)
    return dq, lse, delta


def attention_bwd(q, k, v, o, do, cu_seqlens, max_len: int, scale: float):
    """Gradients of o = causal softmax(scale q k^T) v over whole sequences packed by cu_seqlens [B + 1] (int32):
    q, o, do [T, Hq, D], k, v [T, Hkv, D] (strided rows allowed) -> (dq, dk, dv) in q.dtype."""
    check(q, k, v, o, do, cu_seqlens)
    if q.shape[0] == 0:
        return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    dq, lse, delta = launch_dq(q, k, v, o, do, cu_seqlens, max_len, scale)
    t, hq, d = q.shape
    hkv = k.shape[1]
    bm, bn, warps, stages = tiles(d)
    dk = torch.empty(t, hkv, d, dtype=k.dtype, device=k.device)
    dv = torch.empty_like(dk)
    upcast = interpreting()
    precision = "ieee" if upcast or q.dtype == torch.float32 else "tf32"
    _attention_dkdv_kernel[(cdiv(max_len, bn), cu_seqlens.numel() - 1, hkv)](
        q, k, v, do, dk, dv, lse, delta, cu_seqlens, float(scale) * LOG2E, float(scale), hq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), do.stride(0), do.stride(1),
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        G=hq // hkv, D=d, BM=bm, BN=bn, UPCAST=upcast, PRECISION=precision, num_warps=warps, num_stages=stages,
        **LAUNCH)
    return dq, dk, dv
