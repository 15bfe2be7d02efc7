"""Prompt lookup (vLLM's "ngram" method): the tokens that followed an earlier occurrence of the sequence's last n
tokens.

Torch-free, on the host. vLLM's rule: the longest suffix n-gram with prompt_lookup_min <= n <= prompt_lookup_max that
occurs earlier in the sequence (prompt and output), at its earliest occurrence; up to k of the tokens after it. Each
sequence's tokens are kept in a numpy buffer that grows with it, so a step costs O(its new tokens) to copy and one
vectorised scan of the sequence per proposal.
"""
from __future__ import annotations

import numpy as np

from samebits.engine.sequence import Sequence


class _Buffer:
    """A sequence's resolved tokens as int64, appended to as it grows (they never change once resolved)."""

    def __init__(self) -> None:
        self.data = np.empty(64, dtype=np.int64)
        self.n = 0

    def sync(self, token_ids: list[int]) -> np.ndarray:
        new = len(token_ids) - self.n
        if new > 0:
            if len(token_ids) > self.data.size:
                grown = np.empty(max(len(token_ids), 2 * self.data.size), dtype=np.int64)
                grown[:self.n] = self.data[:self.n]
                self.data = grown
            self.data[self.n:len(token_ids)] = token_ids[self.n:]
            self.n = len(token_ids)
        return self.data[:self.n]


def lookup(tokens: np.ndarray, min_n: int, max_n: int, k: int) -> list[int]:
    """Up to k tokens after the earliest earlier occurrence of the longest suffix n-gram, n in [min_n, max_n]."""
    last = tokens.size - 1
    if last < min_n:
        return []
    ends = np.flatnonzero(tokens[:last] == tokens[last])  # where a match of length >= 1 ends, before the suffix
    longest, best = (1, ends) if ends.size else (0, ends)
    for m in range(1, min(max_n, last)):
        ends = ends[ends >= m]
        ends = ends[tokens[ends - m] == tokens[last - m]]
        if not ends.size:
            break
        longest, best = m + 1, ends
    if longest < min_n:
        return []
    start = int(best[0]) + 1
    return tokens[start:start + k].tolist()


class NgramDrafter:
    def __init__(self, num_speculative_tokens: int, prompt_lookup_min: int, prompt_lookup_max: int):
        self.k, self.min_n, self.max_n = num_speculative_tokens, prompt_lookup_min, prompt_lookup_max
        self._buffers: dict[int, _Buffer] = {}

    def propose(self, seqs: list[Sequence]) -> dict[int, list[int]]:
        """seq_id -> its drafts, for each decoding sequence of `seqs` with a match; the others' buffers are dropped."""
        buffers, self._buffers = self._buffers, {}
        drafts = {}
        for seq in seqs:
            buffer = self._buffers[seq.seq_id] = buffers.get(seq.seq_id) or _Buffer()
            proposal = lookup(buffer.sync(seq.token_ids), self.min_n, self.max_n, self.k)
            if proposal:
                drafts[seq.seq_id] = proposal
        return drafts
