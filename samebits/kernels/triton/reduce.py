"""Triton two-stage deterministic sum: SPLIT fixed segments summed in parallel, merged in index order."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.arith import cdiv
from samebits.kernels.configs import LAUNCH, TILE_CONFIGS

_CFG = TILE_CONFIGS["det_sum"]["config"]


@triton.jit
def _segment_sum_kernel(x_ptr, part_ptr, n, seg, stride_x, SPLIT: tl.constexpr, BLOCK: tl.constexpr):
    # x [R, n]; part [R, SPLIT] fp32. Program (row, j) sums x[row, j*seg : (j+1)*seg] in BLOCK-wide steps.
    row = tl.program_id(0).to(tl.int64)
    j = tl.program_id(1)
    cols = tl.arange(0, BLOCK)  # [BLOCK]
    lo = j * seg
    hi = tl.minimum(lo + seg, n)
    acc = tl.zeros((BLOCK,), dtype=tl.float32)
    for start in range(lo, hi, BLOCK):
        acc += tl.load(x_ptr + row * stride_x + start + cols, mask=start + cols < hi, other=0.0).to(tl.float32)
    tl.store(part_ptr + row * SPLIT + j, tl.sum(acc, axis=0))


@triton.jit
def _merge_kernel(part_ptr, out_ptr, SPLIT: tl.constexpr):
    # part [R, SPLIT] fp32 -> out [R] fp32, added strictly in index order 0..SPLIT-1.
    row = tl.program_id(0).to(tl.int64)
    acc = tl.load(part_ptr + row * SPLIT)
    for j in range(1, SPLIT):
        acc += tl.load(part_ptr + row * SPLIT + j)
    tl.store(out_ptr + row, acc)


def det_sum_rows(x):
    """x [R, n] -> [R] fp32 sums, order a function of n and the config alone."""
    assert x.dim() == 2, f"det_sum_rows: x {tuple(x.shape)} must be 2-D"
    assert x.dtype in (torch.bfloat16, torch.float16, torch.float32), f"det_sum: dtype {x.dtype} unsupported"
    x = x.contiguous()
    r, n = x.shape
    split = _CFG["split"]
    part = torch.empty(r, split, device=x.device, dtype=torch.float32)
    out = torch.empty(r, device=x.device, dtype=torch.float32)
    if r == 0:
        return out
    seg = max(1, cdiv(n, split))
    _segment_sum_kernel[(r, split)](x, part, n, seg, x.stride(0), SPLIT=split, BLOCK=_CFG["block"],
                                    num_warps=_CFG["num_warps"], **LAUNCH)
    _merge_kernel[(r,)](part, out, SPLIT=split, num_warps=1, **LAUNCH)
    return out
