"""Triton backward of silu(gate) * up: elementwise, each gradient from its own gate, up and output gradient, so the
block cannot change a bit. Torch reference: kernels.grads.silu_and_mul_bwd.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from samebits.kernels.common import interpreting
from samebits.kernels.configs import LAUNCH, TILE_CONFIGS

_CFG = TILE_CONFIGS["silu_and_mul"]["config"]


@triton.jit
def _silu_and_mul_bwd_kernel(DY, X, DX, inter, stride_dy, stride_x, stride_dx, LIBDEVICE: tl.constexpr,
                             BLOCK: tl.constexpr):
    # grid (T, cdiv(I, BLOCK)); X, DX [T, 2I] (gate | up), DY [T, I]; fp32 arithmetic, one rounding.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < inter
    gate = tl.load(X + row * stride_x + cols, mask=ok, other=0.0).to(tl.float32)
    up = tl.load(X + row * stride_x + inter + cols, mask=ok, other=0.0).to(tl.float32)
    dy = tl.load(DY + row * stride_dy + cols, mask=ok, other=0.0).to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-gate)
    else:  # the interpreter has no libdevice
        e = tl.exp(-gate)
    sig = tl.math.div_rn(1.0, 1.0 + e)
    dgate = dy * up * sig * (1.0 + gate * (1.0 - sig))
    dup = dy * gate * sig
    tl.store(DX + row * stride_dx + cols, dgate.to(DX.dtype.element_ty), mask=ok)
    tl.store(DX + row * stride_dx + inter + cols, dup.to(DX.dtype.element_ty), mask=ok)


def silu_and_mul_bwd(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dy [..., I], x [..., 2I] (the forward's input) -> dx [..., 2I] in x.dtype."""
    inter = x.shape[-1] // 2
    assert dy.shape[-1] == inter and dy.shape[:-1] == x.shape[:-1], \
        f"silu_and_mul_bwd: dy {tuple(dy.shape)} for x {tuple(x.shape)}"
    x2, dy2 = x.reshape(-1, 2 * inter), dy.reshape(-1, inter)
    assert x2.stride(-1) == 1 and dy2.stride(-1) == 1, "silu_and_mul_bwd: the last dims must be contiguous"
    dx = torch.empty(x2.shape, dtype=x.dtype, device=x.device)
    if x2.shape[0] and inter:
        block = _CFG["block"]
        _silu_and_mul_bwd_kernel[(x2.shape[0], triton.cdiv(inter, block))](
            dy2, x2, dx, inter, dy2.stride(0), x2.stride(0), dx.stride(0), LIBDEVICE=not interpreting(), BLOCK=block,
            num_warps=_CFG["num_warps"], **LAUNCH)
    return dx.reshape(x.shape)
