"""Test helpers: prefill, decode and greedy drivers over a fresh paged KV cache, on the real kernel registry."""
from __future__ import annotations

import math

import torch

from samebits.kernels import get_ops
from samebits.kernels.attention import AttentionMetadata

BLOCK_SIZE = 16


def get_test_ops(mode="fast", device="cpu"):
    return get_ops(mode, device)


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
    meta = AttentionMetadata.build(query, context, table, BLOCK_SIZE, device)
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


def decode_logits(model, prompt: list[int], continuation: list[int]) -> torch.Tensor:
    """Prefill `prompt`, then feed `continuation` one token per step; the logits predicting each continuation
    token and the one after, [len(continuation) + 1, V] (rows comparable to a full prefill's last rows)."""
    total = len(prompt) + len(continuation)
    caches = _fresh_caches(model, total)
    table = [list(range(math.ceil(total / BLOCK_SIZE)))]
    rows = [_step(model, caches, table, [prompt], [0], last_only=True)[0]]
    for i, tok in enumerate(continuation):
        rows.append(_step(model, caches, table, [[tok]], [len(prompt) + i], last_only=True)[0])
    return torch.stack(rows)


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
