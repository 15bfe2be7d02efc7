"""SwiGLU's activation, silu(gate) * up: the torch reference of the fused Triton kernel (triton/activation.py).

Computed in float32 and rounded once to the input dtype, as the model's other ops. Every element is a function of its
own two inputs, so any tiling gives it the same bits; the kernel reproduces torch's CUDA arithmetic (x / (1 + exp(-x))
with the accurate exp and a correctly rounded division), so the fused and unfused forms agree bit for bit there.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    """x [T, 2I] -> silu(x[:, :I]) * x[:, I:] in x.dtype, computed in float32."""
    i = x.shape[-1] // 2
    xf = x.float()
    return (F.silu(xf[..., :i]) * xf[..., i:]).to(x.dtype)
