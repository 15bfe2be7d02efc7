"""Triton RMSNorm backward (HF Llama's norm, the engine's `rms_norm` and `add_rms_norm`): dx row by row and the
weight's gradient over fixed token splits merged in order (triton/column_sum.py). Torch reference:
kernels.grads.rms_norm_bwd.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels.common import next_pow2
from samebits.kernels.configs import LAUNCH, TILE_CONFIGS
from samebits.kernels.triton.column_sum import ROWS, merge_splits

_CFG = TILE_CONFIGS["train.backward"]["config"]


@triton.jit
def _rms_norm_bwd_kernel(DY, X, W, DS, DX, PART, T, H, stride_dy, stride_x, stride_ds, stride_dx, eps,
                         HAS_DS: tl.constexpr, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # grid (splits,): rows split * ROWS.. in order. A row's sums (its rstd, its dot product) run over one BLOCK-wide
    # vector reduced by tl.sum, a layout fixed by H; PART[split] = the split's rows of dy * round(x * rstd) added in
    # order. dx = rstd (dn - xhat mean(dn xhat)) with dn = dy w, plus DS (HAS_DS), rounded once.
    split = tl.program_id(0)
    cols = tl.arange(0, BLOCK)
    ok = cols < H
    w = tl.load(W + cols, mask=ok, other=0.0).to(tl.float32)
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ROWS):
        r = (split * ROWS + i).to(tl.int64)
        live = ok & (cols * 0 + r < T)
        x = tl.load(X + r * stride_x + cols, mask=live, other=0.0).to(tl.float32)
        dy = tl.load(DY + r * stride_dy + cols, mask=live, other=0.0).to(tl.float32)
        rstd = 1.0 / tl.sqrt_rn(tl.sum(x * x, axis=0) / H + eps)
        xhat = x * rstd
        acc += dy * xhat.to(DX.dtype.element_ty).to(tl.float32)
        dn = dy * w
        dx = (dn - xhat * (tl.sum(dn * xhat, axis=0) / H)) * rstd
        if HAS_DS:
            dx += tl.load(DS + r * stride_ds + cols, mask=live, other=0.0).to(tl.float32)
        tl.store(DX + r * stride_dx + cols, dx.to(DX.dtype.element_ty), mask=live)
    tl.store(PART + split.to(tl.int64) * H + cols, acc, mask=ok)


def rms_norm_bwd(dy, x, weight, eps: float, dsum=None):
    """dy, x [..., H] (x: the norm's input), weight [H], dsum None or [..., H] -> (dx in x.dtype, dweight)."""
    h = x.shape[-1]
    assert h <= _CFG["max_hidden"], f"rms_norm_bwd[triton]: H={h} exceeds the one-block row of {_CFG['max_hidden']}"
    assert dy.shape == x.shape and weight.shape == (h,), f"rms_norm_bwd: dy {tuple(dy.shape)}, x {tuple(x.shape)}"
    x2, dy2 = x.reshape(-1, h).contiguous(), dy.reshape(-1, h).contiguous()
    ds2 = dsum.reshape(-1, h).contiguous() if dsum is not None else dy2
    t = x2.shape[0]
    dx = torch.empty_like(x2)
    splits = max(triton.cdiv(t, ROWS), 1)
    part = torch.zeros(splits, h, dtype=torch.float32, device=x.device)
    if t:
        _rms_norm_bwd_kernel[(splits,)](dy2, x2, weight.contiguous(), ds2, dx, part, t, h, dy2.stride(0),
                                        x2.stride(0), ds2.stride(0), dx.stride(0), float(eps),
                                        HAS_DS=dsum is not None, ROWS=ROWS, BLOCK=next_pow2(h),
                                        num_warps=_CFG["norm_warps"], **LAUNCH)
    return dx.reshape(x.shape), merge_splits(part, weight.dtype)
