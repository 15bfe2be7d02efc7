"""Test helpers: a plain-torch stand-in for the kernel registry (until samebits.kernels lands), and a prefill/greedy
driver over a fresh paged KV cache.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import torch
import torch.nn.functional as F

BLOCK_SIZE = 16


@dataclass
class FakeMeta:
    """AttentionMetadata's fields and meaning, per docs/CONTRACTS.md."""

    cu_seqlens_q: torch.Tensor
    context_lens: torch.Tensor
    block_tables: torch.Tensor
    slot_mapping: torch.Tensor
    max_query_len: int
    max_context_len: int

    @classmethod
    def build(cls, query_lens, context_lens, block_tables, block_size, device):
        cu = torch.tensor([0, *torch.tensor(query_lens).cumsum(0).tolist()], dtype=torch.int32)
        slots = [block_tables[b][p // block_size] * block_size + p % block_size
                 for b, (q, c) in enumerate(zip(query_lens, context_lens)) for p in range(c - q, c)]
        tables = torch.tensor(block_tables, dtype=torch.int32)
        return cls(cu.to(device), torch.tensor(context_lens, dtype=torch.int32, device=device), tables.to(device),
                   torch.tensor(slots, dtype=torch.int64, device=device), max(query_lens), max(context_lens))


class FakeOps:
    """Plain torch, same signatures as samebits.kernels Ops."""

    def __init__(self, mode="fast", device="cpu"):
        self.mode, self.device = mode, torch.device(device)

    def linear(self, x, w, bias=None):
        return F.linear(x, w, bias)

    def rms_norm(self, x, w, eps):
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w

    def add_rms_norm(self, x, residual, w, eps):
        s = x + residual
        return self.rms_norm(s, w, eps), s

    def silu_and_mul(self, x):
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    def rope(self, q, k, positions, cos_sin):
        half = q.shape[-1] // 2
        rows = cos_sin[positions.long()]
        cos, sin = rows[:, None, :half], rows[:, None, half:]

        def rot(x):
            x1, x2 = x[..., :half].float(), x[..., half:].float()
            return torch.cat([x1 * cos - x2 * sin, x2 * cos + x1 * sin], -1).to(x.dtype)

        return rot(q), rot(k)

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping):
        nb, bs, h, d = k_cache.shape
        k_cache.view(nb * bs, h, d)[slot_mapping] = k
        v_cache.view(nb * bs, h, d)[slot_mapping] = v

    def attention(self, q, k_cache, v_cache, meta, scale):
        out = torch.empty_like(q)
        bs = k_cache.shape[1]
        for b in range(len(meta.context_lens)):
            lo, hi = int(meta.cu_seqlens_q[b]), int(meta.cu_seqlens_q[b + 1])
            ctx = int(meta.context_lens[b])
            slots = torch.stack([meta.block_tables[b][p // bs] * bs + p % bs for p in range(ctx)]).long()
            out[lo:hi] = _causal(q[lo:hi], _gather(k_cache, slots), _gather(v_cache, slots), ctx, scale)
        return out


def _gather(cache, slots):
    nb, bs, h, d = cache.shape
    return cache.view(nb * bs, h, d)[slots]


def _causal(q, k, v, ctx, scale):
    t, hq, _ = q.shape
    rep = hq // k.shape[1]
    k, v = k.repeat_interleave(rep, 1).float(), v.repeat_interleave(rep, 1).float()
    scores = torch.einsum("thd,shd->hts", q.float(), k) * scale
    pos_q = torch.arange(ctx - t, ctx)[:, None]
    scores = scores.masked_fill(torch.arange(ctx)[None, :] > pos_q, -math.inf)
    return torch.einsum("hts,shd->thd", scores.softmax(-1), v).to(q.dtype)


def real_kernels_available() -> bool:
    try:
        from samebits.kernels import get_ops  # noqa: F401
        from samebits.kernels.attention import AttentionMetadata  # noqa: F401
    except ImportError:
        return False
    return True


def get_test_ops(mode="fast", device="cpu"):
    if real_kernels_available():
        from samebits.kernels import get_ops

        return get_ops(mode, device)
    return FakeOps(mode, device)


def _meta_cls():
    if real_kernels_available():
        from samebits.kernels.attention import AttentionMetadata

        return AttentionMetadata
    return FakeMeta


def prefill_logits(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    """All prompts in one flattened step over a fresh cache; returns each prompt's [len, V] fp32 logits."""
    cfg, device = model.config, model.device
    lens = [len(p) for p in prompts]
    blocks = [math.ceil(n / BLOCK_SIZE) for n in lens]
    width = max(blocks)
    starts = torch.tensor([0, *blocks]).cumsum(0).tolist()
    tables = [[starts[b] + j if j < blocks[b] else 0 for j in range(width)] for b in range(len(prompts))]
    caches = [(torch.zeros(sum(blocks), BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype=model.dtype, device=device),
               torch.zeros(sum(blocks), BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim, dtype=model.dtype, device=device))
              for _ in range(cfg.num_layers)]
    meta = _meta_cls().build(lens, lens, tables, BLOCK_SIZE, device)
    ids = torch.tensor([t for p in prompts for t in p], dtype=torch.long, device=device)
    pos = torch.tensor([i for n in lens for i in range(n)], dtype=torch.long, device=device)
    logits = model.compute_logits(model(ids, pos, caches, meta))
    return list(logits.split(lens))


def greedy(model, prompt: list[int], max_new: int, eos: set[int]) -> list[int]:
    """Full recompute each step: simplest correct loop, fine for a few dozen tokens of a 135M model."""
    out = list(prompt)
    for _ in range(max_new):
        nxt = int(prefill_logits(model, [out])[0][-1].argmax())
        out.append(nxt)
        if nxt in eos:
            break
    return out[len(prompt):]
