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


# Flipped to True once samebits.kernels (get_ops, AttentionMetadata) is committed.
USE_REAL_KERNELS = False


def real_kernels_available() -> bool:
    if not USE_REAL_KERNELS:
        return False
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


def _fresh_caches(model, num_tokens: int, num_seqs: int = 1):
    cfg = model.config
    blocks = num_seqs * math.ceil(num_tokens / BLOCK_SIZE)
    shape = (blocks, BLOCK_SIZE, cfg.num_kv_heads, cfg.head_dim)
    return [(torch.zeros(shape, dtype=model.dtype, device=model.device),
             torch.zeros(shape, dtype=model.dtype, device=model.device)) for _ in range(cfg.num_layers)]


def _step(model, caches, table, ids: list[list[int]], starts: list[int], last_only=False):
    """One flattened step: sequence b gets ids[b] at positions starts[b]..; returns fp32 logits."""
    device = model.device
    query = [len(x) for x in ids]
    context = [s + q for s, q in zip(starts, query)]
    meta = _meta_cls().build(query, context, table, BLOCK_SIZE, device)
    flat = torch.tensor([t for x in ids for t in x], dtype=torch.long, device=device)
    pos = torch.tensor([s + i for s, q in zip(starts, query) for i in range(q)], dtype=torch.long, device=device)
    hidden = model(flat, pos, caches, meta)
    if last_only:
        hidden = hidden[torch.tensor(query).cumsum(0).to(device) - 1]
    return model.compute_logits(hidden)


def prefill_logits(model, prompts: list[list[int]]) -> list[torch.Tensor]:
    """All prompts in one flattened step over a fresh cache; returns each prompt's [len, V] fp32 logits."""
    per_seq = math.ceil(max(len(p) for p in prompts) / BLOCK_SIZE)
    caches = _fresh_caches(model, per_seq * BLOCK_SIZE, len(prompts))
    table = [[b * per_seq + j for j in range(per_seq)] for b in range(len(prompts))]
    logits = _step(model, caches, table, prompts, [0] * len(prompts))
    return list(logits.split([len(p) for p in prompts]))


def greedy(model, prompt: list[int], max_new: int, eos: set[int]) -> list[int]:
    """Prefill, then one token per step over the same paged cache."""
    total = len(prompt) + max_new
    caches = _fresh_caches(model, total)
    table = [list(range(math.ceil(total / BLOCK_SIZE)))]
    nxt = int(_step(model, caches, table, [prompt], [0], last_only=True)[0].argmax())
    out = [nxt]
    while len(out) < max_new and nxt not in eos:
        nxt = int(_step(model, caches, table, [[nxt]], [len(prompt) + len(out) - 1], last_only=True)[0].argmax())
        out.append(nxt)
    return out
