"""Causal attention of new query tokens over a paged KV cache, batch-invariant in deterministic mode.

One function covers full prefill, chunked prefill, prefix-cache hits and decode: sequence b has `context_lens[b]` tokens
in the cache (its new ones already written), the last `query_len` of them are queries.

Why the bits of a query row cannot depend on the batch:
- keys are folded in fixed KV tiles (`attention.kv_tile`) gathered through the block table, in key order, so neither
  the page size nor the other sequences change the order;
- tiles are grouped into fixed splits of `attention.split_kv` tokens; each split starts a fresh online softmax and is
  folded into the running result in split order 0..n-1 with one formula, whether splits ran sequentially in one program
  (prefill) or in parallel and were merged afterwards (decode);
- query tiles hold rows of (token, GQA head), on the MMA's N side in decode's small tile and on its M side in
  prefill's large one (`attention.query_tile`); on the H200 a row's products and MMA sums have the same bits on
  either side and at every tile width, and the softmax's row sum is taken through the MMA in both, so they agree;
- a tile or split that holds none of a row's keys leaves that row's state untouched (explicit select), so rows that share
  a tile with later positions run exactly the arithmetic they would alone.
"""
from __future__ import annotations

import dataclasses
import functools
import itertools
from dataclasses import dataclass

import torch

from samebits.arith import cdiv, kv_slot
from samebits.kernels.common import to_device
from samebits.kernels.configs import TILE_CONFIGS

# A token's GQA rows must fit one query tile of every backend; the CPU's canonical block is the largest one every
# machine admits (kernels/cpu/gemm.py), and Triton's tiles grow to the group.
MAX_GQA_GROUP = TILE_CONFIGS["cpu_gemm"]["config"]["canonical_rows"]
_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


class AttentionUnsupported(RuntimeError):
    """Deterministic attention cannot run this input; raised instead of falling back to a batch-variant path."""


@dataclass
class AttentionMetadata:
    cu_seqlens_q: torch.Tensor  # [B + 1] int32, offsets of each sequence's new tokens in the flat batch
    context_lens: torch.Tensor  # [B] int32, cached + new tokens per sequence
    block_tables: torch.Tensor  # [B, max_blocks] int32, KV block ids per sequence (unused entries arbitrary)
    slot_mapping: torch.Tensor  # [T] int64, cache slot of each new token (block * BS + offset)
    max_query_len: int
    max_context_len: int
    # How many sequences at the batch's start have one new token (the scheduler puts running decodes first): the
    # Triton launcher gives them decode tiles in a mixed step. Changes no bit.
    leading_decodes: int = 0

    @property
    def num_seqs(self) -> int:
        return self.context_lens.shape[0]

    @functools.cached_property
    def decodes_and_rest(self) -> tuple[AttentionMetadata, AttentionMetadata]:
        """The leading decodes and the other sequences as metadata of their own: sequence slices (views), computed
        once per step for every layer. Token offsets stay absolute, so the decodes' tokens are the batch's first
        leading_decodes and the rest's are where they were."""
        n = self.leading_decodes
        head = dataclasses.replace(self, cu_seqlens_q=self.cu_seqlens_q[:n + 1], context_lens=self.context_lens[:n],
                                   block_tables=self.block_tables[:n], max_query_len=1)
        rest = dataclasses.replace(self, cu_seqlens_q=self.cu_seqlens_q[n:], context_lens=self.context_lens[n:],
                                   block_tables=self.block_tables[n:], leading_decodes=0)
        return head, rest

    def derived(self, key: tuple, build):
        """build(), computed once per metadata and kept for every later call with the same `key`: index plans a
        backend derives from this step's batch alone, the same in every layer. `key` names every other input of
        build."""
        memo = self.__dict__.setdefault("_derived", {})
        if key not in memo:
            memo[key] = build()
        return memo[key]

    @classmethod
    def build(cls, query_lens, context_lens, block_tables, block_size: int, device=None) -> AttentionMetadata:
        """From host lists: query_lens[b] new tokens, context_lens[b] total tokens, block_tables[b] block ids."""
        query_lens, context_lens = [int(x) for x in query_lens], [int(x) for x in context_lens]
        # The engine's tables are lists of ints already: only other rows (tensors, arrays) are converted.
        rows = block_tables.tolist() if torch.is_tensor(block_tables) else block_tables
        tables = [t if type(t) is list else list(map(int, t)) for t in rows]
        _check_lens(query_lens, context_lens, tables, block_size)
        slots: list[int] = []
        for q_len, ctx, table in zip(query_lens, context_lens, tables):
            if q_len == 1:  # a decode row: one slot, no comprehension
                slots.append(kv_slot(table, ctx - 1, block_size))
            else:
                slots += [table[p // block_size] * block_size + p % block_size for p in range(ctx - q_len, ctx)]
        width = max([len(t) for t in tables] + [1])
        padded = [t + [0] * (width - len(t)) for t in tables]
        return cls(
            cu_seqlens_q=to_device(list(itertools.accumulate(query_lens, initial=0)), torch.int32, device),
            context_lens=to_device(context_lens, torch.int32, device),
            block_tables=to_device(padded, torch.int32, device).reshape(len(tables), width),
            slot_mapping=to_device(slots, torch.int64, device),
            max_query_len=max(query_lens, default=0),
            max_context_len=max(context_lens, default=0),
            leading_decodes=next((b for b, n in enumerate(query_lens) if n != 1), len(query_lens)),
        )


def _check_lens(query_lens, context_lens, tables, block_size) -> None:
    if not (len(query_lens) == len(context_lens) == len(tables)):
        raise ValueError(f"AttentionMetadata.build: {len(query_lens)} query_lens, {len(context_lens)} context_lens, "
                         f"{len(tables)} block tables")
    for b, (q_len, ctx, table) in enumerate(zip(query_lens, context_lens, tables)):
        if not 0 <= q_len <= ctx:
            raise ValueError(f"AttentionMetadata.build: sequence {b} has query_len {q_len} > context_len {ctx}")
        if len(table) * block_size < ctx:
            raise ValueError(f"AttentionMetadata.build: sequence {b} needs {cdiv(ctx, block_size)} blocks of "
                             f"{block_size} for {ctx} tokens, block table has {len(table)}")


def fail(why: str, q, k_cache, mode: str) -> None:
    raise AttentionUnsupported(
        f"paged_attention ({mode}): {why}; q {tuple(q.shape)} {q.dtype} on {q.device}, "
        f"k_cache {tuple(k_cache.shape)} {k_cache.dtype} on {k_cache.device}")


def check(q, k_cache, v_cache, meta, mode: str, head_dims: tuple[int, ...] | None = None) -> None:
    """The checks every backend's attention runs first; `head_dims`: the only head dims a backend has tiles for."""
    def bad(why: str) -> None:
        fail(why, q, k_cache, mode)

    if q.dim() != 3 or k_cache.dim() != 4 or k_cache.shape != v_cache.shape:
        bad("q must be [T, Hq, D] and both caches [NB, BS, Hkv, D]")
    if q.shape[2] != k_cache.shape[3] or q.shape[1] % k_cache.shape[2]:
        bad("head dims differ or Hq is not a multiple of Hkv")
    if q.dtype not in _DTYPES or k_cache.dtype != q.dtype or v_cache.dtype != q.dtype:
        bad(f"q and caches must share one dtype of {_DTYPES}")
    if q.device != k_cache.device or q.device.type not in ("cpu", "cuda"):
        bad("q and caches must be on one cpu or cuda device")
    if q.shape[1] // k_cache.shape[2] > MAX_GQA_GROUP:
        bad(f"GQA group {q.shape[1] // k_cache.shape[2]} exceeds the {MAX_GQA_GROUP}-row query tile")
    if head_dims and q.shape[2] not in head_dims:
        bad(f"head_dim {q.shape[2]} has no fixed Triton tile (supported: {head_dims})")
    if meta.cu_seqlens_q.shape[0] != meta.num_seqs + 1:
        bad("cu_seqlens_q must have B + 1 entries")


def run_checked(kernel, mode: str, q, k_cache, v_cache, meta, scale: float,
                head_dims: tuple[int, ...] | None = None) -> torch.Tensor:
    """A backend's attention op: the checks, then kernel(q, k_cache, v_cache, meta, scale) unless T == 0."""
    check(q, k_cache, v_cache, meta, mode, head_dims)
    if q.shape[0] == 0:
        return torch.empty_like(q)
    return kernel(q, k_cache, v_cache, meta, scale)


def paged_attention(q: torch.Tensor, k_cache: torch.Tensor, v_cache: torch.Tensor, meta: AttentionMetadata,
                    scale: float, deterministic: bool = True) -> torch.Tensor:
    """q [T, Hq, D] -> [T, Hq, D] in q.dtype; caches [NB, BS, Hkv, D] already hold the new tokens' K/V.

    The `attention` op of get_ops(mode, q.device), for callers that hold no ops table (tests, probes)."""
    from samebits.kernels.ops import get_ops

    mode = "deterministic" if deterministic else "fast"
    check(q, k_cache, v_cache, meta, mode)  # names a wrong device before the table is asked for it
    return get_ops(mode, q.device).attention(q, k_cache, v_cache, meta, scale)


# ---------------------------------------------------------------------------------------------------------------------
# Fast mode's per-sequence SDPA and the float64 reference.


def _gather_seq(cache, table, ctx):
    _, bs, h, d = cache.shape
    n_blocks = cdiv(ctx, bs)
    return cache[table[:n_blocks].long()].reshape(n_blocks * bs, h, d)[:ctx]


def _per_sequence(q, k_cache, v_cache, meta, fn):
    out = torch.empty_like(q)
    cu, ctx_lens = meta.cu_seqlens_q.tolist(), meta.context_lens.tolist()
    tables = meta.block_tables.to(q.device)
    g = q.shape[1] // k_cache.shape[2]
    for b, ctx in enumerate(ctx_lens):
        q0, q1 = cu[b], cu[b + 1]
        if q1 == q0:
            continue
        k = _gather_seq(k_cache, tables[b], ctx).repeat_interleave(g, dim=1)
        v = _gather_seq(v_cache, tables[b], ctx).repeat_interleave(g, dim=1)
        pos = torch.arange(ctx - (q1 - q0), ctx, device=q.device)
        allowed = torch.arange(ctx, device=q.device)[None, :] <= pos[:, None]  # [n_new, ctx]
        out[q0:q1] = fn(q[q0:q1], k, v, allowed).to(q.dtype)
    return out


def paged_attention_sdpa(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Fast mode: torch SDPA per sequence over gathered KV (its blocking follows the shapes: not batch-invariant)."""
    import torch.nn.functional as F

    def sdpa(qs, k, v, allowed):
        return F.scaled_dot_product_attention(qs.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                              attn_mask=allowed, scale=scale).transpose(0, 1)

    return _per_sequence(q, k_cache, v_cache, meta, sdpa)


def paged_attention_reference(q, k_cache, v_cache, meta: AttentionMetadata, scale: float) -> torch.Tensor:
    """Float64 softmax attention; returns float64 [T, Hq, D] for accuracy bounds."""
    def exact(qs, k, v, allowed):
        s = torch.einsum("thd,shd->hts", qs.double(), k.double()) * scale
        s = s.masked_fill(~allowed[None], float("-inf"))
        return torch.einsum("hts,shd->thd", torch.softmax(s, -1), v.double())

    return _per_sequence(q.double(), k_cache.double(), v_cache.double(), meta, exact)
