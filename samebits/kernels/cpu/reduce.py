"""Row sums whose addition order is written here: a halving tree over the zero-padded power-of-two width.

Level by level, element i is added to element i + P/2 (P the current width), until one remains. Elementwise additions
are rounded alike by every CPU, vector unit and thread split, so the order is a function of the row's length alone;
a zero upper half leaves the lower half unchanged, so padding a row further never changes its sum.
"""
from __future__ import annotations

import torch

from samebits.kernels.common import next_pow2


def tree_sum(x: torch.Tensor, dim: int = -1) -> torch.Tensor:
    """Sum over `dim` in float32 (the dim is removed)."""
    x = x.movedim(dim, -1).float()
    n = x.shape[-1]
    width = next_pow2(max(n, 1))
    if n == 0:
        return x.new_zeros(x.shape[:-1])
    if width != n:
        half = width // 2
        # The first level, with the zero padding folded in: only the overlap [half, n) adds anything.
        low = x[..., :half].clone()
        low[..., :n - half] += x[..., half:]
        x, width = low, half
    while width > 1:
        half = width // 2
        x = x[..., :half] + x[..., half:width]
        width = half
    return x[..., 0]
