"""The RoPE cos/sin table of an HF config: `rope_theta` and `rope_scaling` (HF semantics), built once on the CPU.

float64 cos/sin of a float32 angle, rounded to float32 (TILE_CONFIGS["rope.table"]), so its bits are the same whatever
device uses it; the kernels only apply it (samebits.kernels.rope).
"""
from __future__ import annotations

import math

import torch

from samebits.kernels.vector_math import settle


def _inv_freq(head_dim: int, theta: float) -> torch.Tensor:
    # As HF `_compute_default_rope_parameters`: float32 exponent, float32 power.
    return 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=torch.int64).float() / head_dim))


def _llama3_inv_freq(inv_freq: torch.Tensor, scaling: dict) -> torch.Tensor:
    # As HF `_compute_llama3_parameters`: low frequencies divided by `factor`, high ones kept, a smooth ramp between.
    factor = scaling["factor"]
    low, high = scaling["low_freq_factor"], scaling["high_freq_factor"]
    old_len = scaling["original_max_position_embeddings"]
    low_wavelen, high_wavelen = old_len / low, old_len / high
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > low_wavelen, inv_freq / factor, inv_freq)
    smooth = (old_len / wavelen - low) / (high - low)
    smoothed = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < high_wavelen) * ~(wavelen > low_wavelen)
    return torch.where(medium, smoothed, scaled)


def scaled_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
    inv_freq = _inv_freq(head_dim, theta)
    if not scaling:
        return inv_freq
    kind = scaling.get("rope_type", scaling.get("type", "default"))
    if kind == "default":
        return inv_freq
    if kind == "llama3":
        return _llama3_inv_freq(inv_freq, scaling)
    raise NotImplementedError(f"rope_cos_sin: rope_scaling type {kind!r} is not supported (default, llama3 are)")


def rope_cos_sin(head_dim: int, max_positions: int, theta: float, scaling: dict | None = None,
                 device=None) -> torch.Tensor:
    """[max_positions, head_dim] float32: cos in the first half, sin in the second, each head_dim/2 wide."""
    if head_dim % 2:
        raise ValueError(f"rope_cos_sin: head_dim must be even, got {head_dim}")
    settle()
    inv_freq = scaled_inv_freq(head_dim, theta, scaling)
    angle = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]  # float32, as HF
    angle = angle.double()
    table = torch.cat([angle.cos(), angle.sin()], dim=-1).float()
    return table.to(device) if device is not None else table
