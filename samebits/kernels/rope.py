"""Rotary position embedding, HF Llama layout (rotate_half: the first and second halves of the head dim pair up).

Elementwise per (token, head): no reduction, so batch-invariant by construction. The kernel only applies a cos/sin
table ([max_pos, D] float32: cos in the first half, sin in the second); building it (HF rope_scaling) is the model's
business (samebits/models/rope_scaling.py). `apply_rope` is the torch op of the CPU backends and the Triton kernel's
reference; `rope_write_kv` (a layer's RoPE, then its keys and values into the paged cache) theirs for the fused one.
"""
from __future__ import annotations

import torch

from samebits.kernels.kv_cache import write_kv

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check(q, k, positions, cos_sin) -> None:
    what = f"apply_rope(q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} on {q.device})"
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"{what}: q must be [T, Hq, D] and k [T, Hkv, D]")
    if q.dtype != k.dtype or q.dtype not in _DTYPES:
        raise TypeError(f"{what}: q and k must share a dtype in {_DTYPES}")
    if cos_sin.dtype != torch.float32 or cos_sin.dim() != 2 or cos_sin.shape[1] != q.shape[2]:
        raise ValueError(f"{what}: cos_sin must be [max_pos, D] float32, got {tuple(cos_sin.shape)} {cos_sin.dtype}")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"{what}: positions must be [T], got {tuple(positions.shape)}")


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [T, H, D]; cos/sin [T, 1, D/2] float32. Computed in float32, rounded once to x.dtype.
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by their positions [T]; returns new tensors in the input dtype."""
    check(q, k, positions, cos_sin)
    half = q.shape[-1] // 2
    rows = cos_sin[positions.long()]
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    return _rotate(q, cos, sin), _rotate(k, cos, sin)


def rope_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping) -> torch.Tensor:
    """A layer's RoPE and KV write: q and k rotated (apply_rope), the rotated k and v stored at their slots
    (kv_cache.write_kv); returns the rotated q. A backend may fuse the two; the bits are these."""
    q, k = apply_rope(q, k, positions, cos_sin)
    write_kv(k, v, k_cache, v_cache, slot_mapping)
    return q
