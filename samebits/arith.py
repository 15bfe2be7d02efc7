"""Integer helpers shared by the torch-free scheduler, the block manager, the kernels and the loaders."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0 (blocks for a context, tiles for a length)."""
    return -(-a // b)


def kv_slot(block_table, position: int, block_size: int) -> int:
    """Flat KV-cache slot of a sequence's token at `position`: its block's id * block_size + the offset in it."""
    return block_table[position // block_size] * block_size + position % block_size
