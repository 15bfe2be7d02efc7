"""The acceptance rule, and the counts behind vLLM's spec-decode metrics. Torch-free: it reads the step's read-back.

A verify chunk's row i is sampled exactly as plain decoding samples that position: the same logits bits (the kernels
give a row the same bits among 1 + k rows as alone), the same parameters, the same key (seed, sample index, position),
and a history that equals plain decoding's wherever it matters (the penalties count row i's history, the previous
drafts, which are the plain tokens for every row that is kept). So draft i + 1 is accepted exactly when it equals
row i's draw, and the kept tokens, their logprobs and the finish are plain decoding's bits. Standard speculative
sampling (accept with probability p/q, resample the residual) gives the same distribution but other bits.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field


def accepted_prefix(drafts: Sequence[int], draws: Sequence[int]) -> int:
    """How many leading drafts equal the draws of the rows before them (draws[i] is sampled where drafts[i] sits)."""
    n = 0
    for draft, draw in zip(drafts, draws):
        if draft != draw:
            break
        n += 1
    return n


@dataclass
class SpecDecodeStats:
    """Cumulative counts of verified drafts, vLLM's SpecDecodingStats: a draft is one chunk's proposal; accepted
    tokens exclude the bonus token. Counted as verified, before a stop rule may drop tokens after an accepted one."""

    num_speculative_tokens: int
    num_drafts: int = 0
    num_draft_tokens: int = 0
    num_accepted_tokens: int = 0
    accepted_per_pos: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.accepted_per_pos = self.accepted_per_pos or [0] * self.num_speculative_tokens

    def observe(self, num_draft_tokens: int, num_accepted: int) -> None:
        self.num_drafts += 1
        self.num_draft_tokens += num_draft_tokens
        self.num_accepted_tokens += num_accepted
        for i in range(num_accepted):
            self.accepted_per_pos[i] += 1

    @property
    def acceptance_rate(self) -> float:
        """Accepted over drafted tokens (vLLM's draft acceptance rate); nan before any draft."""
        return self.num_accepted_tokens / self.num_draft_tokens if self.num_draft_tokens else float("nan")

    @property
    def mean_acceptance_length(self) -> float:
        """Tokens a verify chunk yields on average, its bonus token included (vLLM's convention); 1 before any."""
        return 1 + self.num_accepted_tokens / self.num_drafts if self.num_drafts else 1.0
