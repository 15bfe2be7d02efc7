"""The row-parallel reduction: each rank's float32 partial sums, merged in an order fixed here.

`tree_merge` adds neighbours pairwise, level by level ((p0+p1)+(p2+p3))..., elementwise additions that every device
rounds alike, so a sum's order is a function of the number of partials alone: never of the number of tokens, the
message size or the library's algorithm. Routes (`EngineConfig.all_reduce`):
- `ordered`: all-gather the partials and `tree_merge` them in rank order on every rank (every rank gets the same bits).
- `native`: the library's all-reduce (NCCL picks algorithm and channels from the message size, so a token's order can
  follow how many tokens share the step: the speed reference, and the negative control).
"""
from __future__ import annotations

import torch

from samebits.kernels.configs import TILE_CONFIGS

TP_MAX = TILE_CONFIGS["tensor_parallel"]["config"]["tp_max"]


def tree_merge(partials: torch.Tensor) -> torch.Tensor:
    """[C, ...] -> [...]: neighbours added pairwise until one is left; C a power of two."""
    c = partials.shape[0]
    if c & (c - 1):
        raise ValueError(f"tree_merge needs a power-of-two count of partials, got {c}")
    while partials.shape[0] > 1:
        partials = partials[0::2] + partials[1::2]
    return partials[0]


def reduce_partials(partial: torch.Tensor, group, route: str) -> torch.Tensor:
    """This rank's partial sum -> the sum over every rank, the same bits on each."""
    if route == "ordered":
        return tree_merge(group.all_gather(partial))
    return group.all_reduce_sum(partial)
