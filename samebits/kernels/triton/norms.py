"""Triton RMSNorm (optionally fused with the residual add): one row per program, fixed block."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels.common import next_pow2
from samebits.kernels.configs import LAUNCH, TILE_CONFIGS

_CFG = TILE_CONFIGS["rms_norm"]["config"]


@triton.jit
def _rms_norm_kernel(x_ptr, r_ptr, w_ptr, y_ptr, s_ptr, H, stride_x, stride_r, stride_y, stride_s, eps,
                     HAS_RES: tl.constexpr, BLOCK: tl.constexpr, ONE_BLOCK: tl.constexpr):
    # x, r, y, s [T, H]; w [H]. Program `row` owns row `row`: its order is a function of H and BLOCK only.
    # ONE_BLOCK (H <= BLOCK): the row stays in registers between the two passes instead of being read again, and the
    # weight load is issued before the sum: the same arithmetic on the same values, one memory round trip fewer.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    if ONE_BLOCK:
        mask = cols < H
        xf = _row_in(x_ptr, r_ptr, s_ptr, row, stride_x, stride_r, stride_s, 0, cols, mask, HAS_RES).to(tl.float32)
        w = tl.load(w_ptr + cols, mask=mask, other=0.0).to(tl.float32)
        acc += xf * xf
        rstd = 1.0 / tl.sqrt_rn(tl.sum(acc, axis=0) / H + eps)
        _row_out(y_ptr, row, stride_y, 0, cols, mask, xf, w, rstd)
    else:
        for start in range(0, H, BLOCK):
            mask = start + cols < H
            xf = _row_in(x_ptr, r_ptr, s_ptr, row, stride_x, stride_r, stride_s, start, cols, mask,
                         HAS_RES).to(tl.float32)
            acc += xf * xf
        rstd = 1.0 / tl.sqrt_rn(tl.sum(acc, axis=0) / H + eps)
        for start in range(0, H, BLOCK):
            mask = start + cols < H
            if HAS_RES:
                x = tl.load(s_ptr + row * stride_s + start + cols, mask=mask, other=0.0).to(tl.float32)
            else:
                x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32)
            w = tl.load(w_ptr + start + cols, mask=mask, other=0.0).to(tl.float32)
            _row_out(y_ptr, row, stride_y, start, cols, mask, x, w, rstd)


@triton.jit
def _row_in(x_ptr, r_ptr, s_ptr, row, stride_x, stride_r, stride_s, start, cols, mask, HAS_RES: tl.constexpr):
    # One block of the row in the model dtype: x, or x + r rounded to the dtype and stored to s.
    x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=0.0)
    if HAS_RES:
        # Round the sum to the model dtype first: the unfused model adds in that dtype.
        x = (x.to(tl.float32) + tl.load(r_ptr + row * stride_r + start + cols, mask=mask,
                                        other=0.0).to(tl.float32)).to(s_ptr.dtype.element_ty)
        tl.store(s_ptr + row * stride_s + start + cols, x, mask=mask)
    return x


@triton.jit
def _row_out(y_ptr, row, stride_y, start, cols, mask, x, w, rstd):
    # HF Llama: normalise in fp32, round to the model dtype, then scale by the weight in that dtype.
    y = (x * rstd).to(y_ptr.dtype.element_ty).to(tl.float32) * w
    tl.store(y_ptr + row * stride_y + start + cols, y.to(y_ptr.dtype.element_ty), mask=mask)


def _launch(x, residual, weight, eps, two_pass=False):
    """two_pass: the loop that reads the row again even where it fits one block (tests and A/Bs: the same bits)."""
    assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"rms_norm: dtype {x.dtype} unsupported"
    assert weight.shape == x.shape[-1:], f"rms_norm: weight {tuple(weight.shape)} for x {tuple(x.shape)}"
    h = x.shape[-1]
    x2 = x.reshape(-1, h).contiguous()
    w = weight.to(x.dtype).contiguous()
    y = torch.empty_like(x2)
    r2 = residual.reshape(-1, h).contiguous() if residual is not None else x2
    s = torch.empty_like(x2) if residual is not None else x2
    block = min(next_pow2(h), _CFG["max_block"])
    if x2.shape[0]:
        _rms_norm_kernel[(x2.shape[0],)](
            x2, r2, w, y, s, h, x2.stride(0), r2.stride(0), y.stride(0), s.stride(0), float(eps),
            HAS_RES=residual is not None, BLOCK=block, ONE_BLOCK=h <= block and not two_pass,
            num_warps=_CFG["num_warps"], **LAUNCH)
    return y.reshape(x.shape), s.reshape(x.shape)


def rms_norm(x, weight, eps):
    """x [..., H], weight [H] -> [..., H] in x.dtype."""
    return _launch(x, None, weight, eps)[0]


def add_rms_norm(x, residual, weight, eps):
    """-> (rms_norm(x + residual), x + residual)."""
    assert residual.shape == x.shape and residual.dtype == x.dtype, "add_rms_norm: residual must match x"
    return _launch(x, residual, weight, eps)
