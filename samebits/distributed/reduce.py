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


def differences_with_tokens(rank: int, world: int, port: int, seed: int, results) -> None:
    """One rank of the measurement behind the routes above, as `group.run_ranks` runs it (tests/distributed/
    test_collectives.py): per route, how many elements of a T-row reduction differ from the same rows reduced inside a
    4096-row message (the number of tokens in the step is all that changes); rank 0 puts {route: count} on `results`.
    """
    from samebits.distributed.group import Group, join_store, open_store

    torch.set_num_threads(1)
    store = open_store(world, 60, port) if rank == 0 else join_store(port, world, 60)
    group = Group.open(store, rank, world, torch.device("cpu"), 60, 60)
    g = torch.Generator().manual_seed(seed + rank)
    partial = torch.randn(4096, 512, generator=g) * torch.logspace(-4, 4, 512)  # magnitudes where order shows
    counts = {}
    for route in ("ordered", "native"):
        full = reduce_partials(partial.clone(), group, route)
        counts[route] = sum(int((reduce_partials(partial[:t].clone(), group, route).view(torch.int32)
                                 != full[:t].view(torch.int32)).sum()) for t in (1, 3, 17, 64, 1000))
    if rank == 0:
        results.put(counts)
    group.close()
