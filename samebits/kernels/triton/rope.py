"""Triton RoPE (HF rotate_half layout): elementwise per (token, head), fp32 arithmetic, one rounding.
Torch reference: kernels.rope.apply_rope.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels.triton.attention import FP_FUSION


@triton.jit
def _rope_kernel(X, OUT, positions, COS_SIN, stride_xt, stride_xh, stride_ot, stride_oh, num_heads,
                 HALF: tl.constexpr, BLOCK_H: tl.constexpr):
    # grid (T,): every head of token t rotated by the table row of its position; fp32 arithmetic, one rounding.
    t = tl.program_id(0)
    pos = tl.load(positions + t).to(tl.int64)
    j = tl.arange(0, HALF)
    cos = tl.load(COS_SIN + pos * (2 * HALF) + j)[None, :]  # [1, HALF]
    sin = tl.load(COS_SIN + pos * (2 * HALF) + HALF + j)[None, :]
    hh = tl.arange(0, BLOCK_H)
    ok = (hh < num_heads)[:, None]
    x_ptr = X + t * stride_xt + hh[:, None] * stride_xh + j[None, :]
    x1 = tl.load(x_ptr, mask=ok, other=0.0).to(tl.float32)  # [BLOCK_H, HALF]
    x2 = tl.load(x_ptr + HALF, mask=ok, other=0.0).to(tl.float32)
    o_ptr = OUT + t * stride_ot + hh[:, None] * stride_oh + j[None, :]
    tl.store(o_ptr, (x1 * cos - x2 * sin).to(OUT.dtype.element_ty), mask=ok)
    tl.store(o_ptr + HALF, (x2 * cos + x1 * sin).to(OUT.dtype.element_ty), mask=ok)


def _rope_one(x, positions, cos_sin):
    t, h, d = x.shape
    assert x.stride(2) == 1, f"apply_rope[triton]: head dim of {tuple(x.shape)} must be contiguous, {x.stride()}"
    assert cos_sin.is_contiguous() and cos_sin.device == x.device, "apply_rope[triton]: table must be contiguous"
    assert d & (d - 1) == 0, f"apply_rope[triton]: head_dim {d} must be a power of two"
    out = torch.empty(t, h, d, dtype=x.dtype, device=x.device)
    _rope_kernel[(t,)](x, out, positions, cos_sin, x.stride(0), x.stride(1), out.stride(0), out.stride(1), h,
                       HALF=d // 2, BLOCK_H=triton.next_power_of_2(h), enable_fp_fusion=FP_FUSION)
    return out


def apply_rope(q, k, positions, cos_sin):
    return _rope_one(q, positions, cos_sin), _rope_one(k, positions, cos_sin)
