"""DEMONSTRATION OF THE BUG, NOT A SAMEBITS KERNEL: the attention backward's dQ accumulated with float atomics.

FlashAttention-2's original backward (and Triton's tutorial) lets each key block's program add its share of dQ,
dS K, into an fp32 buffer with `tl.atomic_add`: one kernel instead of two, and dQ's sum over key blocks lands in the
order the hardware finishes the programs. The deterministic kernels (attention_bwd.py) write each dQ row from one
program in key order instead. This variant is the negative control of the trainer's run-to-run gradient test
(tests/rl/test_train_gpu.py): the same dK and dV, dQ through the atomics. Nothing in the engine or the trainer may
call it; the PTX audit leaves it out, as it does kernels/demos/splitk_atomic.py.

REVERSED runs the key blocks' programs in the opposite launch order: the Triton interpreter runs programs one after
another in grid order, so on the CPU the atomics always land in one order, and reversing the grid stands in for the
GPU's scheduler finishing them in another.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.arith import cdiv
from samebits.kernels.common import interpreting
from samebits.kernels.configs import LAUNCH
from samebits.kernels.triton.attention import LOG2E
from samebits.kernels.triton.attention_bwd import _operand, _rows, _sequence, _store_rows, check, dkdv_tile, launch_dq
from samebits.kernels.triton.attention_bwd import tiles as _tiles
from samebits.kernels.triton.mma import mma


@triton.jit
def _dkdv_atomic_dq_kernel(Q, K, V, DO, DK, DV, DQ32, LSE, DELTA, cu_seqlens, qk_scale, scale, num_q_heads,
                           stride_qt, stride_qh, stride_kt, stride_kh, stride_vt, stride_vh, stride_dot, stride_doh,
                           stride_dkt, stride_dkh, stride_dvt, stride_dvh,
                           G: tl.constexpr, D: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr,
                           UPCAST: tl.constexpr, PRECISION: tl.constexpr, REVERSED: tl.constexpr):
    # _attention_dkdv_kernel, and each (query block, key block) pair's dS K added into DQ32 [T, Hq, D] fp32.
    pid = tl.program_id(0)
    if REVERSED:
        pid = tl.num_programs(0) - 1 - pid
    n0 = pid * BN
    b = tl.program_id(1)
    hk = tl.program_id(2)
    start, n = _sequence(cu_seqlens, b)
    if n0 < n:
        cols = n0 + tl.arange(0, BN)
        k = _operand(_rows(K, start, cols, n, hk, stride_kt, stride_kh, D), UPCAST)
        v = _operand(_rows(V, start, cols, n, hk, stride_vt, stride_vh, D), UPCAST)
        dk = tl.zeros([BN, D], tl.float32)
        dv = tl.zeros([BN, D], tl.float32)
        d = tl.arange(0, D)
        for g in range(G):
            h = hk * G + g
            for m0 in range(n0 // BM * BM, n, BM):
                dk, dv, dst = dkdv_tile(k, v, dk, dv, Q, DO, LSE, DELTA, start, n, cols, m0, h, qk_scale,
                                           num_q_heads, stride_qt, stride_qh, stride_dot, stride_doh, D, BM, UPCAST,
                                           PRECISION)
                dq = mma(tl.trans(dst).to(k.dtype), k, None, UPCAST, PRECISION) * scale  # [BM, D]
                rows = m0 + tl.arange(0, BM)
                at = ((start + rows).to(tl.int64) * num_q_heads + h)[:, None] * D + d[None, :]
                # samebits: intentionally nondeterministic because this is the bug being shown: dQ's sum over key
                # blocks lands in the order the hardware finishes these programs.
                tl.atomic_add(DQ32 + at, dq, mask=(rows < n)[:, None])
        _store_rows(DK, start, cols, n, hk, stride_dkt, stride_dkh, dk * scale, D)
        _store_rows(DV, start, cols, n, hk, stride_dvt, stride_dvh, dv, D)


def attention_bwd_atomic_dq(q, k, v, o, do, cu_seqlens, max_len: int, scale: float, reversed_grid: bool = False):
    """attention_bwd.attention_bwd's signature and dK, dV; dQ summed over key blocks through float atomics."""
    check(q, k, v, o, do, cu_seqlens)
    _, lse, delta = launch_dq(q, k, v, o, do, cu_seqlens, max_len, scale)  # the logsumexp and delta it needs
    t, hq, d = q.shape
    hkv = k.shape[1]
    bm, bn, warps, stages = _tiles(d)
    dk = torch.empty(t, hkv, d, dtype=k.dtype, device=k.device)
    dv = torch.empty_like(dk)
    dq32 = torch.zeros(t, hq, d, dtype=torch.float32, device=q.device)
    upcast = interpreting()
    _dkdv_atomic_dq_kernel[(cdiv(max_len, bn), cu_seqlens.numel() - 1, hkv)](
        q, k, v, do, dk, dv, dq32, lse, delta, cu_seqlens, float(scale) * LOG2E, float(scale), hq,
        q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), v.stride(1), do.stride(0), do.stride(1),
        dk.stride(0), dk.stride(1), dv.stride(0), dv.stride(1),
        G=hq // hkv, D=d, BM=bm, BN=bn, UPCAST=upcast,
        PRECISION="ieee" if upcast or q.dtype == torch.float32 else "tf32", REVERSED=reversed_grid,
        num_warps=warps, num_stages=stages, **LAUNCH)
    return dq32.to(q.dtype), dk, dv
