"""The implementations a probe compares: `vendor` (torch as shipped) and `samebits` (the deterministic kernel registry).

Both expose one small surface so every probe runs the same code against either: linear, rms_norm, log_softmax, softmax,
sum (of all elements) and a dense attention `attend(q[B,Hq,Lq,D], k[B,Hkv,Lk,D], v, scale)` where query i sits at position Lk - Lq + i.
"""
from __future__ import annotations

from dataclasses import dataclass

from samebits.arith import cdiv


class NotBuilt(Exception):
    """The samebits registry lacks an op a probe needs (the kernels are still landing)."""


@dataclass
class Impl:
    name: str
    ops: object | None
    unavailable: str = ""

    @property
    def available(self) -> bool:
        return self.ops is not None


class VendorOps:
    """Plain torch calls, as a model written against torch would make them."""

    def __init__(self, device):
        self.device = device

    def linear(self, x, w, bias=None):
        import torch.nn.functional as F

        return F.linear(x, w, bias)

    def rms_norm(self, x, w, eps):
        import torch.nn.functional as F

        return F.rms_norm(x, (x.shape[-1],), w, eps)

    def log_softmax(self, x, dim=-1):
        return x.float().log_softmax(dim)

    def softmax(self, x, dim=-1):
        return x.float().softmax(dim)

    def sum(self, x):
        return x.sum()

    def attend(self, q, k, v, scale):
        import torch.nn.functional as F

        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1)
        # SDPA's is_causal aligns the mask top-left; only Lq == Lk (prefill) or Lq == 1 (decode) are asked for.
        return F.scaled_dot_product_attention(q, k, v, is_causal=q.shape[2] > 1, scale=scale)


class SamebitsOps:
    """The registry's ops, with dense attention routed through the paged kernel the engine uses."""

    block_size = 16

    def __init__(self, ops, device):
        self.ops = ops
        self.device = device

    def _op(self, name: str):
        fn = getattr(self.ops, name, None)
        if fn is None:
            raise NotBuilt(f"ops.{name}")
        return fn

    def linear(self, x, w, bias=None):
        return self._op("linear")(x, w, bias)

    def rms_norm(self, x, w, eps):
        return self._op("rms_norm")(x.reshape(-1, x.shape[-1]), w, eps).view(x.shape)

    def log_softmax(self, x, dim=-1):
        return self._op("log_softmax")(x, dim)

    def softmax(self, x, dim=-1):
        return self._op("softmax")(x, dim)

    def sum(self, x):
        from samebits.kernels import det_sum

        return det_sum(x)

    def attend(self, q, k, v, scale):
        from samebits.kernels.attention import AttentionMetadata, paged_attention

        b, hq, lq, d = q.shape
        k_cache, v_cache, tables = _to_paged(k, self.block_size), _to_paged(v, self.block_size), _block_tables(k, self)
        meta = AttentionMetadata.build([lq] * b, [k.shape[2]] * b, tables, self.block_size, q.device)
        out = paged_attention(q.transpose(1, 2).reshape(b * lq, hq, d), k_cache, v_cache, meta, scale)
        return out.view(b, lq, hq, d).transpose(1, 2)


def _to_paged(x, block_size: int):
    """[B, H, L, D] -> [B * blocks, block_size, H, D]; sequence b owns blocks b*n .. b*n + n - 1 (copies are exact)."""
    import torch.nn.functional as F

    _b, h, n_tok, d = x.shape
    pad = -n_tok % block_size
    x = F.pad(x.transpose(1, 2), (0, 0, 0, 0, 0, pad))
    return x.reshape(-1, block_size, h, d).contiguous()


def _block_tables(k, ops):
    import torch

    b, n_tok = k.shape[0], k.shape[2]
    per_seq = cdiv(n_tok, ops.block_size)
    return torch.arange(b * per_seq, dtype=torch.int32, device=k.device).view(b, per_seq)


def vendor(device) -> Impl:
    return Impl("vendor", VendorOps(device))


def samebits(device) -> Impl:
    # Narrow on purpose: "not built yet" is expected while the kernels land; any other failure is a real bug to see.
    try:
        from samebits.kernels import get_ops

        ops = get_ops("deterministic", device)
    except (ImportError, AttributeError, NotImplementedError):
        return Impl("samebits", None, "not built")
    return Impl("samebits", SamebitsOps(ops, device))


def all_impls(device) -> list[Impl]:
    return [vendor(device), samebits(device)]
