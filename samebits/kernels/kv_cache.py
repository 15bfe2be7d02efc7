"""The paged KV store: per layer a K and a V cache of shape [NB, BS, Hkv, D], addressed by flat slot = block * BS + offset.

Writing is a copy (no arithmetic), so it is batch-invariant by construction. `write_kv` is the torch op of the CPU
backends and the reference of the Triton kernel (triton/kv_write.py), which the GPU takes instead of index_copy_ (whose
CUDA implementation may use atomics for duplicate indices).
"""
from __future__ import annotations

import torch

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def allocate_kv_cache(num_layers: int, num_blocks: int, block_size: int, num_kv_heads: int, head_dim: int,
                      dtype: torch.dtype, device) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Zero-filled so masked-out cache rows hold finite values (0 * NaN would poison a tile)."""
    shape = (num_blocks, block_size, num_kv_heads, head_dim)
    return [(torch.zeros(shape, dtype=dtype, device=device), torch.zeros(shape, dtype=dtype, device=device))
            for _ in range(num_layers)]


def check(k, v, k_cache, v_cache, slot_mapping) -> None:
    what = f"write_kv(k {tuple(k.shape)} {k.dtype} on {k.device}, cache {tuple(k_cache.shape)} {k_cache.dtype})"
    if k.dim() != 3 or k.shape != v.shape:
        raise ValueError(f"{what}: k and v must both be [T, Hkv, D], got {tuple(k.shape)} and {tuple(v.shape)}")
    if k_cache.dim() != 4 or k_cache.shape != v_cache.shape or k_cache.shape[2:] != k.shape[1:]:
        raise ValueError(f"{what}: caches must be [NB, BS, Hkv, D] matching k, got {tuple(v_cache.shape)}")
    if k.dtype != k_cache.dtype or v.dtype != v_cache.dtype or k.dtype not in _DTYPES:
        raise TypeError(f"{what}: k/v/cache dtypes must agree and be one of {_DTYPES}")
    if slot_mapping.shape != (k.shape[0],) or slot_mapping.dtype not in (torch.int64, torch.int32):
        raise ValueError(f"{what}: slot_mapping must be [T] int64, got {tuple(slot_mapping.shape)} {slot_mapping.dtype}")
    if not k_cache.is_contiguous() or not v_cache.is_contiguous():
        raise ValueError(f"{what}: caches must be contiguous")


def write_kv(k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor,
             slot_mapping: torch.Tensor) -> None:
    """Store new keys/values [T, Hkv, D] at their slots, in place; slots < 0 are padding and are skipped."""
    check(k, v, k_cache, v_cache, slot_mapping)
    keep = slot_mapping >= 0
    slots = slot_mapping[keep].long()
    nb, bs, h, d = k_cache.shape
    k_cache.view(nb * bs, h, d)[slots] = k[keep]
    v_cache.view(nb * bs, h, d)[slots] = v[keep]
