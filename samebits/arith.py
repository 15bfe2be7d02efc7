"""Integer helpers shared by the torch-free scheduler, the block manager, the kernels and the loaders."""
from __future__ import annotations


def cdiv(a: int, b: int) -> int:
    """ceil(a / b) for ints, b > 0 (blocks for a context, tiles for a length)."""
    return -(-a // b)
