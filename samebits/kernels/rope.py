"""Rotary position embedding, HF Llama layout (rotate_half: the first and second halves of the head dim pair up).

Elementwise per (token, head): no reduction, so batch-invariant by construction. The cos/sin table is built once on the
CPU (float64 cos/sin of a float32 angle, rounded to float32) so its bits are the same whatever device uses it.
"""
from __future__ import annotations

import math

import torch

_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


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


def _scaled_inv_freq(head_dim: int, theta: float, scaling: dict | None) -> torch.Tensor:
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
    inv_freq = _scaled_inv_freq(head_dim, theta, scaling)
    angle = torch.arange(max_positions, dtype=torch.float32)[:, None] * inv_freq[None, :]  # float32, as HF
    angle = angle.double()
    table = torch.cat([angle.cos(), angle.sin()], dim=-1).float()
    return table.to(device) if device is not None else table


def _check(q, k, positions, cos_sin) -> None:
    what = f"apply_rope(q {tuple(q.shape)} {q.dtype}, k {tuple(k.shape)} on {q.device})"
    if q.dim() != 3 or k.dim() != 3 or q.shape[0] != k.shape[0] or q.shape[2] != k.shape[2]:
        raise ValueError(f"{what}: q must be [T, Hq, D] and k [T, Hkv, D]")
    if q.dtype != k.dtype or q.dtype not in _DTYPES:
        raise TypeError(f"{what}: q and k must share a dtype in {_DTYPES}")
    if cos_sin.dtype != torch.float32 or cos_sin.dim() != 2 or cos_sin.shape[1] != q.shape[2]:
        raise ValueError(f"{what}: cos_sin must be [max_pos, D] float32, got {tuple(cos_sin.shape)} {cos_sin.dtype}")
    if positions.shape != (q.shape[0],):
        raise ValueError(f"{what}: positions must be [T], got {tuple(positions.shape)}")


def _rotate_reference(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [T, H, D]; cos/sin [T, 1, D/2] float32. Computed in float32, rounded once to x.dtype.
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half].float(), x[..., half:].float()
    out = torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], dim=-1)
    return out.to(x.dtype)


def apply_rope_reference(q, k, positions, cos_sin):
    half = q.shape[-1] // 2
    rows = cos_sin[positions.long()]
    cos, sin = rows[:, None, :half], rows[:, None, half:]
    return _rotate_reference(q, cos, sin), _rotate_reference(k, cos, sin)


def apply_rope(q: torch.Tensor, k: torch.Tensor, positions: torch.Tensor,
               cos_sin: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Rotate q [T, Hq, D] and k [T, Hkv, D] by their positions [T]; returns new tensors in the input dtype."""
    _check(q, k, positions, cos_sin)
    if q.is_cuda and q.shape[0]:
        from samebits.kernels import attention_triton

        return attention_triton.apply_rope(q, k, positions, cos_sin)
    return apply_rope_reference(q, k, positions, cos_sin)
