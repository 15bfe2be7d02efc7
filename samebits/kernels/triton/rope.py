"""Triton RoPE (HF rotate_half layout): elementwise per (token, head), fp32 arithmetic, one rounding.
Torch reference: kernels.rope.apply_rope; for the fused RoPE and KV write, kernels.rope.rope_write_kv.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels.triton.attention import FP_FUSION
from samebits.kernels.triton.kv_write import _copy_row


@triton.jit
def _rotate(X, OUT, t, cos, sin, stride_xt, stride_xh, stride_ot, stride_oh, num_heads,
            HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    # Every head of token t of X rotated into OUT; cos, sin [1, HALF] fp32; fp32 arithmetic, one rounding.
    j = tl.arange(0, HALF)
    hh = tl.arange(0, BLOCK_H)
    ok = (hh < num_heads)[:, None]
    x_ptr = X + t * stride_xt + hh[:, None] * stride_xh + j[None, :]
    x1 = tl.load(x_ptr, mask=ok, other=0.0).to(tl.float32)  # [BLOCK_H, HALF]
    x2 = tl.load(x_ptr + HALF, mask=ok, other=0.0).to(tl.float32)
    o_ptr = OUT + t * stride_ot + hh[:, None] * stride_oh + j[None, :]
    tl.store(o_ptr, (x1 * cos - x2 * sin).to(OUT.dtype.element_ty), mask=ok)
    tl.store(o_ptr + HALF, (x2 * cos + x1 * sin).to(OUT.dtype.element_ty), mask=ok)


@triton.jit
def _table_row(positions, COS_SIN, t, HALF: tl.constexpr):
    # cos and sin [1, HALF] fp32 of token t's position.
    pos = tl.load(positions + t).to(tl.int64)
    j = tl.arange(0, HALF)
    cos = tl.load(COS_SIN + pos * (2 * HALF) + j)[None, :]
    sin = tl.load(COS_SIN + pos * (2 * HALF) + HALF + j)[None, :]
    return cos, sin


@triton.jit
def _rope_kernel(Q, K, QO, KO, positions, COS_SIN, stride_qt, stride_qh, stride_kt, stride_kh, stride_qot, stride_qoh,
                 stride_kot, stride_koh, num_q_heads, num_k_heads,
                 HALF: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr):
    # grid (T, 2): token t's query heads (axis 1 = 0) or key heads (1), rotated by the table row of its position. One
    # launch for both: a decode step's layer is otherwise two launches of a few microseconds each.
    t = tl.program_id(0)
    cos, sin = _table_row(positions, COS_SIN, t, HALF)
    if tl.program_id(1) == 0:
        _rotate(Q, QO, t, cos, sin, stride_qt, stride_qh, stride_qot, stride_qoh, num_q_heads, HALF, BLOCK_Q)
    else:
        _rotate(K, KO, t, cos, sin, stride_kt, stride_kh, stride_kot, stride_koh, num_k_heads, HALF, BLOCK_K)


@triton.jit
def _rope_write_kv_kernel(Q, K, V, QO, KC, VC, positions, slots, COS_SIN, stride_qt, stride_qh, stride_kt, stride_kh,
                          stride_vt, stride_qot, stride_qoh, num_q_heads, num_k_heads,
                          HALF: tl.constexpr, BLOCK_Q: tl.constexpr, BLOCK_K: tl.constexpr, BLOCK_V: tl.constexpr):
    # grid (T, 2): token t's query heads rotated into QO (axis 1 = 0), or its key heads rotated straight into the
    # cache row slots[t] and its values copied there (1; slots < 0 are padding, skipped). _rotate's arithmetic, so the
    # bits of _rope_kernel then _write_kv_kernel, in one launch instead of two.
    t = tl.program_id(0)
    cos, sin = _table_row(positions, COS_SIN, t, HALF)
    if tl.program_id(1) == 0:
        _rotate(Q, QO, t, cos, sin, stride_qt, stride_qh, stride_qot, stride_qoh, num_q_heads, HALF, BLOCK_Q)
    else:
        slot = tl.load(slots + t)
        if slot >= 0:
            row = slot * num_k_heads * (2 * HALF)  # the cache row: [Hkv * D] contiguous
            _rotate(K, KC + row, t, cos, sin, stride_kt, stride_kh, 0, 2 * HALF, num_k_heads, HALF, BLOCK_K)
            _copy_row(V + t * stride_vt, VC + row, num_k_heads * (2 * HALF), BLOCK_V)


def _check(x, cos_sin, name: str) -> None:
    d = x.shape[2]
    assert x.stride(2) == 1, f"apply_rope[triton]: {name}'s head dim of {tuple(x.shape)} must be contiguous, {x.stride()}"
    assert cos_sin.is_contiguous() and cos_sin.device == x.device, "apply_rope[triton]: table must be contiguous"
    assert d & (d - 1) == 0, f"apply_rope[triton]: head_dim {d} must be a power of two"


def apply_rope(q, k, positions, cos_sin):
    """q [T, Hq, D], k [T, Hkv, D] (strided rows allowed) -> rotated copies, in one launch."""
    _check(q, cos_sin, "q")
    _check(k, cos_sin, "k")
    assert k.shape[0] == q.shape[0] and k.shape[2] == q.shape[2], \
        f"apply_rope[triton]: q {tuple(q.shape)} and k {tuple(k.shape)} need the same tokens and head dim"
    t, hq, d = q.shape
    hk = k.shape[1]
    qo = torch.empty(t, hq, d, dtype=q.dtype, device=q.device)
    ko = torch.empty(t, hk, d, dtype=k.dtype, device=k.device)
    _rope_kernel[(t, 2)](q, k, qo, ko, positions, cos_sin, q.stride(0), q.stride(1), k.stride(0), k.stride(1),
                         qo.stride(0), qo.stride(1), ko.stride(0), ko.stride(1), hq, hk, HALF=d // 2,
                         BLOCK_Q=triton.next_power_of_2(hq), BLOCK_K=triton.next_power_of_2(hk),
                         enable_fp_fusion=FP_FUSION)
    return qo, ko


def rope_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping):
    """q [T, Hq, D] rotated into a new tensor, returned; k [T, Hkv, D] rotated and v copied into the caches at their
    slots (strided rows allowed, each token's v contiguous), in one launch."""
    _check(q, cos_sin, "q")
    _check(k, cos_sin, "k")
    t, hq, d = q.shape
    hk = k.shape[1]
    what = f"rope_write_kv[triton](q {tuple(q.shape)}, k {tuple(k.shape)}, v strides {v.stride()})"
    assert v.stride(2) == 1 and v.stride(1) == d, f"{what}: each token's [Hkv, D] of v must be contiguous"
    assert k_cache.dtype == k.dtype and v_cache.dtype == v.dtype, f"{what}: caches must have k's and v's dtype"
    assert slot_mapping.device == q.device, f"{what}: slot_mapping must be on {q.device}"
    qo = torch.empty(t, hq, d, dtype=q.dtype, device=q.device)
    _rope_write_kv_kernel[(t, 2)](q, k, v, qo, k_cache, v_cache, positions, slot_mapping.long(), cos_sin,
                                  q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0), qo.stride(0),
                                  qo.stride(1), hq, hk, HALF=d // 2, BLOCK_Q=triton.next_power_of_2(hq),
                                  BLOCK_K=triton.next_power_of_2(hk), BLOCK_V=triton.next_power_of_2(hk * d),
                                  enable_fp_fusion=FP_FUSION)
    return qo
