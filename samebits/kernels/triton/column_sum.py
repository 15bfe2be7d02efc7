"""Sums over the packed tokens (a weight gradient of a norm or a bias) with a written order: fixed splits of
`token_rows` rows, each split one program adding its rows in order into a float32 partial, then the partials added in
split order by one program per column block (configs.py, train.backward). The order is a function of the token count
alone. Torch reference: kernels.grads.bias_grad.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels.configs import LAUNCH, TILE_CONFIGS

_CFG = TILE_CONFIGS["train.backward"]["config"]
ROWS = _CFG["token_rows"]
BLOCK = _CFG["column_block"]


@triton.jit
def _split_sum_kernel(X, PART, T, N, stride_x, ROWS: tl.constexpr, BLOCK: tl.constexpr):
    # grid (splits, column blocks): PART[split, cols] = X[split rows, cols] added row by row.
    split = tl.program_id(0)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    acc = tl.zeros([BLOCK], tl.float32)
    for i in range(ROWS):
        r = split * ROWS + i
        acc += tl.load(X + r.to(tl.int64) * stride_x + cols, mask=ok & (cols * 0 + r < T), other=0.0).to(tl.float32)
    tl.store(PART + split.to(tl.int64) * N + cols, acc, mask=ok)


@triton.jit
def _merge_splits_kernel(PART, OUT, splits, N, BLOCK: tl.constexpr):
    # grid (column blocks,): OUT[cols] = PART[0, cols] + PART[1, cols] + ... in split order, rounded once.
    cols = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < N
    acc = tl.zeros([BLOCK], tl.float32)
    for s in range(splits):
        acc += tl.load(PART + s * N + cols, mask=ok, other=0.0)  # S * N is far below 2^31
    tl.store(OUT + cols, acc.to(OUT.dtype.element_ty), mask=ok)


def merge_splits(part: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """part [S, N] float32 -> [N] in dtype, the splits added in order."""
    assert part.dtype == torch.float32 and part.is_contiguous(), "merge_splits: part must be dense float32 [S, N]"
    splits, n = part.shape
    out = torch.empty(n, dtype=dtype, device=part.device)
    _merge_splits_kernel[(triton.cdiv(n, BLOCK),)](part, out, splits, n, BLOCK=BLOCK,
                                                   num_warps=_CFG["column_warps"], **LAUNCH)
    return out


def column_sum(x: torch.Tensor) -> torch.Tensor:
    """x [T, N] (rows strided, columns contiguous) -> [N] in x.dtype: the sum over T in the split order."""
    assert x.dim() == 2 and x.stride(1) == 1, f"column_sum: x {tuple(x.shape)} strides {x.stride()}"
    t, n = x.shape
    splits = max(triton.cdiv(t, ROWS), 1)
    part = torch.zeros(splits, n, dtype=torch.float32, device=x.device)
    if t:
        _split_sum_kernel[(splits, triton.cdiv(n, BLOCK))](x, part, t, n, x.stride(0), ROWS=ROWS, BLOCK=BLOCK,
                                                           num_warps=_CFG["column_warps"], **LAUNCH)
    return merge_splits(part, x.dtype)
