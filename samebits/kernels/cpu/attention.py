"""Deterministic paged attention on the CPU: the same bits for a query row in prefill, chunked prefill and decode, and
whatever else shares the step.

A query chunk is up to `query_rows` (token, GQA head) rows of one sequence against one KV head; an entry is a chunk's
rows for one KV head. Per entry, in two passes over KV tiles of `kv_tokens` keys in key order (the page size never
enters):
1. scores of every tile the chunk can see, one canonical block GEMM per tile ([r, D] x [D, tile]); the row max (exact
   in any order); exp(s - max);
2. P @ [V | 1] tile by tile, added in tile order: the ones column gives the softmax denominator from the same GEMM. A
   row skips (explicit select) every tile that holds none of its keys, so a row folds the same tiles in the same order
   whether it is decoded alone or sits in a prefill chunk with later rows, and however many tiles its group spans.
Entries go through `entry_gemm` (one torch.bmm where the batch was proven to give every entry its own canonical
torch.mm bits, else one torch.mm each), so how entries are grouped never moves a bit: the one-chunk sequences (decode
rows, verify chunks) holding the same numbers of new tokens and tiles are one group (a few ops per group, not per
sequence), a longer prefill's chunks go one by one over their sequence's keys. The block size r of a chunk is the smallest admitted for both tile GEMM shapes.
"""
from __future__ import annotations

from collections import defaultdict

import torch

from samebits.arith import cdiv
from samebits.kernels.common import next_pow2
from samebits.kernels.configs import TILE_CONFIGS
from samebits.kernels.cpu.gemm import BLOCK_ROWS, block_for, entry_gemm, largest_block
from samebits.kernels.vector_math import settle

_CFG = TILE_CONFIGS["attention.cpu"]["config"]
QUERY_ROWS = _CFG["query_rows"]
KV_TILE = _CFG["kv_tokens"]
VALUE_PAD = _CFG["value_pad"]


def _row_sizes(rows: int) -> tuple[int, ...]:
    return tuple(r for r in BLOCK_ROWS if r <= rows)


def prove(head_dim: int, tile: int = KV_TILE) -> int:
    """Run the self-tests of both tile GEMM shapes now (load time), so a refusal comes before serving. (torch.bmm's
    batch sizes are proven when first met: a failed one only means one torch.mm per entry.)"""
    return block_for(_shapes(head_dim, tile), 1, _row_sizes(QUERY_ROWS))


def _shapes(d: int, tile: int) -> list[tuple[int, int]]:
    return [(d, tile), (tile, d + VALUE_PAD)]  # (K, N) of q @ k^T and of p @ [v | 1]


def _group_kv(k_cache, v_cache, tables, ctx, chunk_seqs, n_vis: int, tile: int, n_entries: int):
    """The group's keys [n_vis, E, tile, D] and values [n_vis, E, D + pad, tile] in entry order (chunk, KV head),
    gathered through the block tables in key order. Values are transposed with a row of ones after them (the softmax
    denominator) and zero where a sequence holds no key (keys there are masked out of the scores, so their garbage
    only has to be finite; a value's has to be zero so p = 0 adds an exact zero). Padding entries are zero."""
    _, bs, h, d = k_cache.shape
    n_chunks, length = len(chunk_seqs), n_vis * tile
    seq_tables, seq_ctx = tables[chunk_seqs], ctx[chunk_seqs]
    p = torch.arange(length)
    block = (p // bs).clamp(max=seq_tables.shape[1] - 1)
    slots = seq_tables[:, block].long() * bs + p % bs  # [C, L]
    keys = k_cache.view(-1, h, d)[slots].view(n_chunks, n_vis, tile, h, d)
    values = v_cache.view(-1, h, d)[slots]
    values.masked_fill_((p[None, :] >= seq_ctx[:, None])[:, :, None, None], 0.0)
    values = values.view(n_chunks, n_vis, tile, h, d)
    k = torch.zeros(n_vis, n_entries, tile, d)
    k[:, :n_chunks * h] = keys.permute(1, 0, 3, 2, 4).reshape(n_vis, n_chunks * h, tile, d)
    v = torch.zeros(n_vis, n_entries, d + VALUE_PAD, tile)
    v[:, :n_chunks * h, :d] = values.permute(1, 0, 3, 4, 2).reshape(n_vis, n_chunks * h, d, tile)
    v[:, :n_chunks * h, d] = 1.0
    return k, v


def _attend(qc, keys, values, pos, scale, tile):
    """qc [E, r, D]; keys [n_vis, E, tile, D]; values [n_vis, E, W, tile]; pos [E, r] (-1: padding row).
    Returns [E, r, D] float32."""
    e, r, d = qc.shape
    n_vis = keys.shape[0]
    s = qc.new_empty(n_vis, e, r, tile)
    for t in range(n_vis):
        entry_gemm(qc, keys[t], s[t])
    s *= scale
    key_index = torch.arange(n_vis * tile).view(n_vis, 1, 1, tile)
    s.masked_fill_(key_index > pos[None, :, :, None], float("-inf"))
    m = s.amax(dim=(0, 3))
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # padding rows: all masked, p = 0
    p = torch.exp(s - m[None, :, :, None])
    acc = qc.new_empty(e, r, values.shape[2])
    entry_gemm(p[0], values[0], acc)
    part = torch.empty_like(acc)
    for t in range(1, n_vis):
        entry_gemm(p[t], values[t], part)
        acc = torch.where((pos >= t * tile)[:, :, None], acc + part, acc)
    denom = acc[..., d]
    return acc[..., :d] / torch.where(denom > 0, denom, torch.ones_like(denom))[..., None]


def _chunks(meta, tokens_per_chunk: int):
    """(seq, first query row in q, tokens, first position) of every query chunk, by sequence."""
    cu, ctx_lens = meta.cu_seqlens_q.tolist(), meta.context_lens.tolist()
    by_seq = {}
    for b, ctx in enumerate(ctx_lens):
        n_new = cu[b + 1] - cu[b]
        by_seq[b] = [(b, cu[b] + t0, min(tokens_per_chunk, n_new - t0), ctx - n_new + t0)
                     for t0 in range(0, n_new, tokens_per_chunk)]
    return by_seq


def _group_inputs(q, chunks, r, g, h_kv, n_entries):
    """qc [E, r, D] and pos [E, r] for a group's chunks, zero entries (all rows padding) up to n_entries."""
    d = q.shape[2]
    n_tok = chunks[0][2]
    rows = torch.tensor([[q0 + i for i in range(n_tok)] for _, q0, _, _ in chunks])  # [C, n_tok]
    first = torch.tensor([c[3] for c in chunks])
    qc = q.new_zeros(n_entries, r, d, dtype=torch.float32)
    part = q[rows].float().view(len(chunks), n_tok, h_kv, g, d).permute(0, 2, 1, 3, 4)
    qc[:len(chunks) * h_kv, :n_tok * g] = part.reshape(len(chunks) * h_kv, n_tok * g, d)
    pos = torch.full((n_entries, r), -1, dtype=torch.int64)
    tok_pos = (first[:, None] + torch.arange(n_tok)[None, :])[:, None, :, None].expand(-1, h_kv, -1, g)
    pos[:len(chunks) * h_kv, :n_tok * g] = tok_pos.reshape(len(chunks) * h_kv, n_tok * g)
    return qc, pos, rows


def paged_attention_cpu(q, k_cache, v_cache, meta, scale: float, *, rows: int = QUERY_ROWS,
                        tile: int = KV_TILE) -> torch.Tensor:
    """Deterministic CPU path; the keyword knobs exist for negative controls only.

    The sequences whose new tokens fit one chunk (decode rows, speculative decoding's verify chunks of 1 + k rows)
    and hold the same number of tokens and tiles are one group: entries of many sequences in one torch.bmm per tile.
    A longer prefill's chunks go one by one over their sequence's keys, gathered once. Every entry gets its canonical
    bits either way, so the two agree (tests/kernels/test_attention.py)."""
    settle()
    h_kv = k_cache.shape[2]
    g = q.shape[1] // h_kv
    rows = largest_block(_shapes(q.shape[2], tile), _row_sizes(rows))  # chunks of a block this machine admits
    out = torch.empty_like(q)
    tables, ctx = meta.block_tables.cpu(), meta.context_lens.cpu().long()
    ctx_list = ctx.tolist()
    single = defaultdict(list)
    for b, chunks in _chunks(meta, rows // g).items():
        if not chunks:
            continue
        if len(chunks) == 1:  # a decode row, a verify chunk of 1 + k rows, a short prompt
            single[chunks[0][2], cdiv(ctx_list[b], tile)].append(chunks[0])
            continue
        n_tiles = cdiv(ctx_list[b], tile)
        keys, values = _group_kv(k_cache, v_cache, tables, ctx, torch.tensor([b]), n_tiles, tile, h_kv)
        for chunk in chunks:
            n_vis = cdiv(chunk[3] + chunk[2], tile)
            _run_group(q, [chunk], keys[:n_vis], values[:n_vis], out, scale, tile, rows, g, h_kv)
    for (_, n_tiles), chunks in single.items():
        n_entries = next_pow2(len(chunks) * h_kv)  # few distinct torch.bmm batch sizes, so few proofs
        keys, values = _group_kv(k_cache, v_cache, tables, ctx, torch.tensor([c[0] for c in chunks]), n_tiles, tile,
                                 n_entries)
        _run_group(q, chunks, keys, values, out, scale, tile, rows, g, h_kv)
    return out


def _run_group(q, chunks, keys, values, out, scale, tile, rows, g, h_kv) -> None:
    """Attend one group of chunks that share n_tok (entries (chunk, KV head)) and write their rows of `out`."""
    _, hq, d = q.shape
    n_tok = chunks[0][2]
    r = block_for(_shapes(d, tile), n_tok * g, _row_sizes(rows))
    qc, pos, q_rows = _group_inputs(q, chunks, r, g, h_kv, keys.shape[1])
    o = _attend(qc, keys, values, pos, scale, tile)[:len(chunks) * h_kv, :n_tok * g]
    o = o.reshape(len(chunks), h_kv, n_tok, g, d).permute(0, 2, 1, 3, 4).reshape(len(chunks) * n_tok, hq, d)
    out[q_rows.reshape(-1)] = o.to(q.dtype)
