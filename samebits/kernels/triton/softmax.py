"""Triton softmax / log_softmax in fp32: one row per program, online max/sum per lane over a fixed block."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels.common import next_pow2
from samebits.kernels.configs import LAUNCH, TILE_CONFIGS

_CFG = TILE_CONFIGS["softmax"]["config"]


@triton.jit
def _softmax_kernel(x_ptr, y_ptr, N, stride_x, stride_y, LOG: tl.constexpr, BLOCK: tl.constexpr):
    # x [R, N] any float dtype, y [R, N] fp32. Lane j sees columns j, j+BLOCK, ... in order.
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    m = tl.full((BLOCK,), float("-inf"), tl.float32)
    s = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(0, N, BLOCK):
        x = tl.load(x_ptr + row * stride_x + start + cols, mask=start + cols < N, other=float("-inf")).to(tl.float32)
        m_new = tl.maximum(m, x)
        # A lane that has seen only -inf keeps s = 0 (exp(-inf - -inf) would be NaN).
        safe = tl.where(m_new == float("-inf"), 0.0, m_new)
        s = s * tl.exp(m - safe) + tl.exp(x - safe)
        m = m_new
    row_max = tl.max(m, axis=0)
    safe_max = tl.where(row_max == float("-inf"), 0.0, row_max)
    total = tl.sum(s * tl.exp(m - safe_max), axis=0)
    log_total = tl.log(total)
    for start in range(0, N, BLOCK):
        mask = start + cols < N
        x = tl.load(x_ptr + row * stride_x + start + cols, mask=mask, other=0.0).to(tl.float32)
        if LOG:
            y = x - row_max - log_total
        else:
            y = tl.exp(x - row_max) / total
        tl.store(y_ptr + row * stride_y + start + cols, y, mask=mask)


def _launch(x, dim, log):
    assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"softmax: dtype {x.dtype} unsupported"
    xt = x.movedim(dim, -1)
    n = xt.shape[-1]
    x2 = xt.reshape(-1, n).contiguous()
    y = torch.empty(x2.shape, device=x.device, dtype=torch.float32)
    if x2.numel():
        _softmax_kernel[(x2.shape[0],)](x2, y, n, x2.stride(0), y.stride(0), LOG=log,
                                        BLOCK=min(next_pow2(n), _CFG["max_block"]),
                                        num_warps=_CFG["num_warps"], **LAUNCH)
    return y.reshape(xt.shape).movedim(-1, dim)


def softmax(x, dim=-1):
    return _launch(x, dim, False)


def log_softmax(x, dim=-1):
    return _launch(x, dim, True)
