"""CUDA graphs for decode-only steps: one graph per padded batch size and attention grid, replayed over static inputs.

A decode batch of n sequences runs as a graph captured for the next bucket size >= n. The padding rows are 1-token
dummies whose KV write is skipped (slot -1) and whose attention reads the runner's scratch block, so in deterministic
mode they change no bit of a real row (each row's arithmetic depends only on its own data). The attention metadata
is captured with max_context_len = the step's grid length (`grid_len`: the KV split times a power of two, at least the
step's longest context, at most max_model_len), so the kernels' grids are fixed per graph; each row still stops at its
own context length, and the split-KV merge gives the same bits as the in-program fold (tested in the attention suite).
A grid of max_model_len for every step cost 1.2-1.3x the attention at 512 tokens (docs/results/HISTORY.md §3).
"""
from __future__ import annotations

import collections

import torch

from samebits.arith import cdiv, kv_slot
from samebits.engine.scheduler.bucketed import bucket_for, capped_ladder
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.common import to_device
from samebits.kernels.configs import TILE_CONFIGS

# Captured batch sizes (then max_num_seqs): denser than doubling above 32, where a padded row costs the most.
CAPTURE_SIZES = (1, 2, 4, 8, 16, 32, 48, 64, 96, 128, 160, 192, 224, 256)
# A capture another thread's CUDA call voided (seen in the server on the H200) is retried at later steps, up to this
# many times per batch size; only then does that size stay eager. Bits never depend on it: eager computes the same rows.
CAPTURE_ATTEMPTS = 3
# The attention's KV split (tokens): a grid of one split folds in one program, more run in parallel and merge.
SPLIT_TOKENS = TILE_CONFIGS["attention.split_kv"]["config"]["tokens"]


class DecodeGraphs:
    def __init__(self, model, kv_caches, block_size: int, scratch_block: int, max_model_len: int, max_num_seqs: int):
        self.model, self.kv_caches = model, kv_caches
        self.block_size, self.scratch_block, self.max_model_len = block_size, scratch_block, max_model_len
        self.buckets = capped_ladder(CAPTURE_SIZES, max_num_seqs)
        dev, n = model.device, self.buckets[-1]
        self.width = cdiv(max_model_len, block_size)
        self.ids = torch.zeros(n, dtype=torch.int64, device=dev)
        self.positions = torch.zeros(n, dtype=torch.int64, device=dev)
        self.cu = torch.arange(n + 1, dtype=torch.int32, device=dev)
        self.ctx = torch.ones(n, dtype=torch.int32, device=dev)
        self.tables = torch.full((n, self.width), scratch_block, dtype=torch.int32, device=dev)
        # Leading table columns any step has written; every column past it still holds the scratch block.
        self.written = 0
        self.slots = torch.full((n,), -1, dtype=torch.int64, device=dev)
        # (batch bucket, grid length) -> the graph and its output buffer.
        self.graphs: dict[tuple[int, int], tuple[torch.cuda.CUDAGraph, torch.Tensor]] = {}
        self.failed_captures: collections.Counter[tuple[int, int]] = collections.Counter()
        self.pool = None

    def graph_key(self, output) -> tuple[int, int] | None:
        """The (batch bucket, grid length) of the graph this step replays, or None when it runs eagerly; one pass over
        the step's sequences, taken once per step (forward is given it)."""
        s = output.scheduled
        # A step the policy padded runs eagerly, as its fixed shape was chosen for the eager kernels.
        if not s or output.padding or len(s) > self.buckets[-1]:
            return None
        longest = 0
        for x in s:
            if x.num_new_tokens != 1:
                return None
            longest = max(longest, x.start + 1)
        if longest > self.max_model_len:
            return None
        key = self.bucket(len(s)), self.grid_len(longest)
        return key if self.failed_captures[key] < CAPTURE_ATTEMPTS else None

    def bucket(self, n: int) -> int:
        return bucket_for(n, self.buckets)

    def grid_len(self, longest: int) -> int:
        """The context length a graph's attention grid covers for a step whose longest context is `longest`."""
        n = SPLIT_TOKENS
        while n < longest:
            n *= 2
        return min(n, self.max_model_len)

    def meta(self, bs: int, grid_len: int | None = None) -> AttentionMetadata:
        return AttentionMetadata(self.cu[:bs + 1], self.ctx[:bs], self.tables[:bs], self.slots[:bs],
                                 max_query_len=1, max_context_len=grid_len or self.max_model_len)

    def fill(self, scheduled, bs: int) -> None:
        """Copy the step's inputs into the static buffers; rows past the real ones become scratch-block dummies.

        Only the columns some step has written are rewritten (the width only grows), so the tables end up exactly as a
        full-width write of max_model_len blocks would leave them, for a fraction of its host work at long contexts."""
        self.written = max([self.written] + [len(s.seq.block_table) for s in scheduled])
        width = self.written
        dummy = [0, 0, 1, -1] + [self.scratch_block] * width
        rows = [self._row(s, width) for s in scheduled] + [dummy] * (bs - len(scheduled))
        rows = to_device(rows, torch.int64, self.ids.device)  # one copy per step, no host sync
        self.ids[:bs], self.positions[:bs] = rows[:, 0], rows[:, 1]
        self.ctx[:bs], self.slots[:bs] = rows[:, 2].int(), rows[:, 3]
        self.tables[:bs, :width] = rows[:, 4:].int()

    def _row(self, s, width: int) -> list[int]:
        """[token, position, context length, KV slot, block table padded with the scratch block to `width`]."""
        table, p = s.seq.block_table, s.start
        padded = table + [self.scratch_block] * (width - len(table))
        return [s.token_ids[0], p, p + 1, kv_slot(table, p, self.block_size)] + padded

    def idle(self, bs: int) -> None:
        """The first bs rows as dummies that write no KV (slot -1): what a warm-up or capture runs."""
        self.ctx[:bs], self.slots[:bs] = 1, -1

    def _eager(self, bs: int, grid_len: int) -> torch.Tensor:
        return self.model.forward(self.ids[:bs], self.positions[:bs], self.kv_caches, self.meta(bs, grid_len))

    def capture(self, key: tuple[int, int]) -> None:
        # Warm up on a side stream (compiles every Triton kernel at these shapes), then capture.
        bs, grid_len = key
        self.idle(bs)
        side = torch.cuda.Stream()
        side.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(side):
            for _ in range(2):
                self._eager(bs, grid_len)
        torch.cuda.current_stream().wait_stream(side)
        graph = torch.cuda.CUDAGraph()
        # thread_local: CUDA calls from other threads (a server's, another engine's) must not void this capture; on
        # the H200 a capture in the server test fell back to eager under the default "global" mode.
        with torch.cuda.graph(graph, pool=self.pool, capture_error_mode="thread_local"):
            out = self._eager(bs, grid_len)
        self.pool = graph.pool()
        self.graphs[key] = (graph, out)

    def forward(self, scheduled, key: tuple[int, int], fill_pending=None) -> torch.Tensor:
        """Hidden states [n, H] of a decode-only step whose graph_key is `key`; `fill_pending(ids)` writes the ids
        still on the device."""
        if key not in self.graphs:
            try:
                self.capture(key)
            except RuntimeError:
                self.failed_captures[key] += 1
                raise
        self.fill(scheduled, key[0])
        if fill_pending is not None:
            fill_pending(self.ids)
        graph, out = self.graphs[key]
        graph.replay()
        return self.real_rows(out, scheduled)

    def real_rows(self, out: torch.Tensor, scheduled) -> torch.Tensor:
        """The output rows of the step's own tokens, in schedule order."""
        return out[:len(scheduled)]
