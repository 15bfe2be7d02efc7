"""One registry per (mode, device): `fast` = vendor torch ops, `deterministic` = samebits' invariant kernels."""
from __future__ import annotations

import torch
import torch.nn.functional as F

import samebits.kernels as K

MODES = ("fast", "deterministic")


class Ops:
    """The op set a model runs on; see docs/CONTRACTS.md. Methods keep the same signatures in both modes."""

    def __init__(self, mode: str, device):
        if mode not in MODES:
            raise ValueError(f"samebits get_ops: mode must be one of {MODES}, got {mode!r}")
        self.mode = mode
        self.device = torch.device(device)
        self.deterministic = mode == "deterministic"

    def __repr__(self) -> str:
        return f"Ops(mode={self.mode!r}, device={str(self.device)!r})"

    def linear(self, x, w, bias=None):
        return K.linear(x, w, bias) if self.deterministic else F.linear(x, w, bias)

    def rms_norm(self, x, w, eps):
        if self.deterministic:
            return K.rms_norm(x, w, eps)
        xf = x.float()
        y = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
        return y.to(x.dtype) * w.to(x.dtype)

    def add_rms_norm(self, x, residual, w, eps):
        if self.deterministic:
            return K.add_rms_norm(x, residual, w, eps)
        s = x + residual
        return self.rms_norm(s, w, eps), s

    def softmax(self, x, dim=-1):
        return K.softmax(x, dim) if self.deterministic else torch.softmax(x, dim, dtype=torch.float32)

    def log_softmax(self, x, dim=-1):
        return K.log_softmax(x, dim) if self.deterministic else torch.log_softmax(x, dim, dtype=torch.float32)

    def silu_and_mul(self, x):
        if self.deterministic:
            return K.silu_and_mul(x)
        i = x.shape[-1] // 2
        return F.silu(x[..., :i]) * x[..., i:]

    def rope(self, q, k, positions, cos_sin):
        from samebits.kernels.rope import apply_rope

        return apply_rope(q, k, positions, cos_sin)

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        from samebits.kernels.kv_cache import write_kv

        return write_kv(k, v, k_cache, v_cache, slot_mapping)

    def attention(self, q, k_cache, v_cache, meta, scale):
        from samebits.kernels.attention import paged_attention

        return paged_attention(q, k_cache, v_cache, meta, scale, deterministic=self.deterministic)


def get_ops(mode: str, device) -> Ops:
    return Ops(mode, device)
