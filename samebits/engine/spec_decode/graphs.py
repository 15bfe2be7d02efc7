"""CUDA graphs for verify steps: decode steps where some chunks carry drafts (engine/cuda_graphs.py's, q rows a
sequence).

Every sequence runs as q = 1 + k rows (k = num_speculative_tokens): its chunk of 1 + k_b rows (the decode token and
its k_b drafts) is padded on the left with the q - 1 - k_b positions before it, recomputed from the sequence's own
tokens and writing no KV (slot -1). So each real row keeps its position, its context and its causal mask, and a
padding row is an earlier row computed again, which no real row reads: in deterministic mode the real rows have the
bits eager execution gives them (each row's arithmetic depends only on its own data). Sequences shorter than q, and
steps with a prefill chunk or padding, run eagerly. Keyed, as decode graphs, by (batch bucket, grid length).
"""
from __future__ import annotations

import torch

from samebits.arith import kv_slot
from samebits.engine.cuda_graphs import CAPTURE_ATTEMPTS, DecodeGraphs
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.common import to_device


class VerifyGraphs(DecodeGraphs):
    def __init__(self, model, kv_caches, block_size: int, scratch_block: int, max_model_len: int, max_num_seqs: int,
                 num_speculative_tokens: int):
        super().__init__(model, kv_caches, block_size, scratch_block, max_model_len, max_num_seqs)
        self.q = q = 1 + num_speculative_tokens
        n, dev = self.buckets[-1], model.device
        self.ids = torch.zeros(n * q, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n * q, dtype=torch.int64, device=dev)
        self.slots = torch.full((n * q,), -1, dtype=torch.int64, device=dev)
        self.cu = torch.arange(0, (n + 1) * q, q, dtype=torch.int32, device=dev)

    def graph_key(self, output) -> tuple[int, int] | None:
        """(batch bucket, grid length) of a step whose every chunk is a decode with at most k drafts, some with
        drafts, each sequence holding at least q tokens; None otherwise."""
        s = output.scheduled
        if not s or output.padding or len(s) > self.buckets[-1]:
            return None
        longest, drafted = 0, False
        for x in s:
            if not x.sample or x.num_new_tokens != 1 + len(x.drafts) or x.num_new_tokens > self.q \
                    or x.context_len < self.q:
                return None
            drafted = drafted or bool(x.drafts)
            longest = max(longest, x.context_len)
        if not drafted or longest > self.max_model_len:
            return None
        key = self.bucket(len(s)), self.grid_len(longest)
        return key if self.failed_captures[key] < CAPTURE_ATTEMPTS else None

    def meta(self, bs: int, grid_len: int | None = None) -> AttentionMetadata:
        return AttentionMetadata(self.cu[:bs + 1], self.ctx[:bs], self.tables[:bs], self.slots[:bs * self.q],
                                 max_query_len=self.q, max_context_len=grid_len or self.max_model_len)

    def idle(self, bs: int) -> None:
        self.ctx[:bs], self.slots[:bs * self.q] = self.q, -1

    def _eager(self, bs: int, grid_len: int) -> torch.Tensor:
        n = bs * self.q
        return self.model.forward(self.ids[:n], self.positions[:n], self.kv_caches, self.meta(bs, grid_len))

    def fill(self, scheduled, bs: int) -> None:
        """The step's rows into the static buffers, each chunk left-padded to q rows; rows past the real sequences
        become q-token dummies on the scratch block."""
        self.written = max([self.written] + [len(s.seq.block_table) for s in scheduled])
        width, q = self.written, self.q
        tokens, seqs = [], []
        for s in scheduled:
            ctx, table = s.context_len, s.seq.block_table
            pad = q - s.num_new_tokens
            tokens += [[t, p, -1 if i < pad else kv_slot(table, p, self.block_size)]
                       for i, (t, p) in enumerate(zip(s.seq.token_ids[ctx - q:ctx], range(ctx - q, ctx)))]
            seqs.append([ctx] + table + [self.scratch_block] * (width - len(table)))
        for _ in range(bs - len(scheduled)):
            tokens += [[0, p, -1] for p in range(q)]
            seqs.append([q] + [self.scratch_block] * width)
        rows = to_device(tokens, torch.int64, self.ids.device)
        per_seq = to_device(seqs, torch.int64, self.ids.device)
        self.ids[:bs * q], self.positions[:bs * q], self.slots[:bs * q] = rows[:, 0], rows[:, 1], rows[:, 2]
        self.ctx[:bs], self.tables[:bs, :width] = per_seq[:, 0].int(), per_seq[:, 1:].int()

    def forward(self, scheduled, key: tuple[int, int], fill_pending=None) -> torch.Tensor:
        if fill_pending is not None:
            raise RuntimeError("a verify step is never launched ahead of its read-back (no pending tokens to fill)")
        return super().forward(scheduled, key)

    def real_rows(self, out: torch.Tensor, scheduled) -> torch.Tensor:
        """The chunks' own rows [sum of chunk lengths, H], in schedule order, as eager execution returns them."""
        q, rows = self.q, []
        for b, s in enumerate(scheduled):
            rows += range(b * q + q - s.num_new_tokens, (b + 1) * q)
        return out.index_select(0, to_device(rows, torch.int64, out.device))
