"""Deterministic paged attention on the CPU: the same bits for a query row in prefill, chunked prefill and decode.

Per sequence, per chunk of query rows ((token, GQA head) pairs, at most `query_rows`), in two passes over KV tiles of
`kv_tokens` keys gathered in key order (the page size never enters):
1. scores of every tile the chunk can see: one proven block GEMM per tile ([Hkv, r, D] x [Hkv, D, tile]); then the
   row max (exact in any order) and exp(s - max);
2. P @ [V | 1] tile by tile, added in tile order: the ones column gives the softmax denominator from the same proven
   GEMM. A row skips (explicit select) every tile that holds none of its keys, so a row folds the same tiles in the same
   order whether it is decoded alone or sits in a prefill chunk with later rows.
The block GEMMs run through kernels/cpu/gemm.py, whose self-test makes a row's bits independent of its place in the
block and of its neighbours; r is the smallest admitted block that holds the chunk.
"""
from __future__ import annotations

import torch

from samebits.kernels.common import cdiv
from samebits.kernels.configs import TILE_CONFIGS
from samebits.kernels.cpu.gemm import BLOCK_ROWS, block_for, block_gemm

_CFG = TILE_CONFIGS["attention.cpu"]["config"]
QUERY_ROWS = _CFG["query_rows"]
KV_TILE = _CFG["kv_tokens"]
VALUE_PAD = _CFG["value_pad"]
_ROWS = tuple(r for r in BLOCK_ROWS if r <= QUERY_ROWS)


def _gather(cache: torch.Tensor, table: torch.Tensor, ctx: int, tile: int, width: int) -> torch.Tensor:
    """[n_tiles, Hkv, tile, width] float32: one sequence's first `ctx` cache rows in key order, zero padded."""
    _, bs, h, d = cache.shape
    n_blocks = cdiv(ctx, bs)
    rows = cache[table[:n_blocks].long()].reshape(n_blocks * bs, h, d)
    n_tiles = cdiv(ctx, tile)
    out = torch.zeros(n_tiles * tile, h, width, dtype=torch.float32)
    out[:ctx, :, :d] = rows[:ctx]
    return out.view(n_tiles, tile, h, width).transpose(1, 2)


def _keys(k_cache, table, ctx, tile):
    return _gather(k_cache, table, ctx, tile, k_cache.shape[3]).contiguous()  # [n_tiles, Hkv, tile, D]


def _values(v_cache, table, ctx, tile):
    """[n_tiles, Hkv, D + pad, tile]: V transposed with a row of ones after it (every key: masked ones have p = 0)."""
    d = v_cache.shape[3]
    v = _gather(v_cache, table, ctx, tile, d + VALUE_PAD)
    v[..., d] = 1.0
    return v.transpose(2, 3).contiguous()


def prove(h_kv: int, head_dim: int) -> None:
    """Run the self-tests of both tile GEMM shapes now (load time), so a refusal comes before serving."""
    block_for([torch.zeros(h_kv, KV_TILE, head_dim), torch.zeros(h_kv, head_dim + VALUE_PAD, KV_TILE)], 1, _ROWS)


def _query_chunk(q_seq: torch.Tensor, t0: int, tokens: int, rows: int, h_kv: int) -> torch.Tensor:
    """[Hkv, rows, D] float32: rows are (token, head-in-group) of tokens t0..t0+tokens-1, zero padded."""
    _, hq, d = q_seq.shape
    g = hq // h_kv
    part = q_seq[t0:t0 + tokens].float().reshape(tokens, h_kv, g, d).permute(1, 0, 2, 3).reshape(h_kv, tokens * g, d)
    out = part.new_zeros(h_kv, rows, d)
    out[:, :tokens * g] = part
    return out


def _attend_chunk(qc, keys, values, pos, scale, tile):
    """qc [Hkv, r, D]; pos [r] positions (-1: padding row). Returns [Hkv, r, D] float32."""
    h, r, d = qc.shape
    n_vis = cdiv(int(pos.max()) + 1, tile)
    s = qc.new_empty(n_vis, h, r, tile)
    for t in range(n_vis):
        block_gemm(qc, keys[t], s[t])
    s *= scale
    key_index = torch.arange(n_vis * tile).view(n_vis, 1, 1, tile)
    s.masked_fill_(key_index > pos.view(1, 1, r, 1), float("-inf"))
    m = s.amax(dim=(0, 3))
    m = torch.where(m == float("-inf"), torch.zeros_like(m), m)  # padding rows: all masked, p = 0
    p = torch.exp(s - m[None, :, :, None])
    acc = qc.new_empty(h, r, values.shape[2])
    block_gemm(p[0], values[0], acc)
    part = torch.empty_like(acc)
    for t in range(1, n_vis):
        block_gemm(p[t], values[t], part)
        sees = (pos >= t * tile).view(1, r, 1)
        acc = torch.where(sees, acc + part, acc)
    denom = acc[..., d]
    return acc[..., :d] / torch.where(denom > 0, denom, torch.ones_like(denom))[..., None]


def paged_attention_cpu(q, k_cache, v_cache, meta, scale: float, *, rows: int = QUERY_ROWS,
                        tile: int = KV_TILE) -> torch.Tensor:
    """Deterministic CPU path; the keyword knobs exist for negative controls only."""
    _, hq, d = q.shape
    h_kv = k_cache.shape[2]
    g = hq // h_kv
    tokens_per_chunk = rows // g
    out = torch.empty_like(q)
    cu, ctx_lens = meta.cu_seqlens_q.tolist(), meta.context_lens.tolist()
    tables = meta.block_tables.cpu()
    for b, ctx in enumerate(ctx_lens):
        q0, q1 = cu[b], cu[b + 1]
        if q1 == q0:
            continue
        keys, values = _keys(k_cache, tables[b], ctx, tile), _values(v_cache, tables[b], ctx, tile)
        first = ctx - (q1 - q0)
        for t0 in range(0, q1 - q0, tokens_per_chunk):
            n_tok = min(tokens_per_chunk, q1 - q0 - t0)
            r = block_for([keys[0], values[0]], n_tok * g, _ROWS)
            qc = _query_chunk(q[q0:q1], t0, n_tok, r, h_kv)
            i = torch.arange(r)
            pos = torch.where(i < n_tok * g, first + t0 + i // g, torch.full_like(i, -1))
            o = _attend_chunk(qc, keys, values, pos, scale, tile)
            o = o[:, :n_tok * g].reshape(h_kv, n_tok, g, d).permute(1, 0, 2, 3).reshape(n_tok, hq, d)
            out[q0 + t0:q0 + t0 + n_tok] = o.to(q.dtype)
    return out
