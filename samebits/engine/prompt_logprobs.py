"""Prompt logprobs (SamplingParams.prompt_logprobs) computed in the step that computes the prompt's rows.

The scheduler marks, per chunk, the positions whose rows score the next prompt token (ScheduledSeq.prompt_rows); the
runner gathers those rows' hidden states, computes their logits and the sampler's own `log_softmax` on them, and the
results travel to the host with the step's draws (SampledStep). A row's bits depend on the row alone in deterministic
mode, so they equal the teacher-forced scoring path's (`LLMEngine.score`) and the decode logprobs of the same tokens.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from samebits.engine.outputs import PromptStepResult
from samebits.engine.sampler import token_ranks, top_k_logprobs
from samebits.kernels.common import to_device

# Prompt rows scored per slice: bounds the [rows, vocab] float32 logits (and their log_softmax, comparison mask and
# sort) a long prefill holds at once. Not a bit-changing constant: each row's bits are its own in deterministic mode.
ROWS_PER_SLICE = 512


@dataclass
class PromptRowsPlan:
    """Which rows of a step's flattened batch score prompt tokens, for whom, and which tokens (on the host)."""

    rows: list[int]  # indices into the step's hidden states, in schedule order
    targets: list[int]  # the prompt token each row scores
    owners: list[tuple]  # (seq, first position, count) per chunk with rows, in row order
    k: int  # the most top-k alternatives any of them asked for

    @classmethod
    def of(cls, scheduled, ends: list[int]) -> PromptRowsPlan | None:
        """None when no chunk of the step has prompt rows (the common case costs one pass over the chunks)."""
        rows, targets, owners = [], [], []
        for s, end in zip(scheduled, ends):
            if not s.prompt_rows:
                continue
            offset = end - s.num_new_tokens - s.start
            rows += [offset + p for p in s.prompt_rows]
            targets += s.seq.token_ids[s.prompt_rows.start + 1:s.prompt_rows.stop + 1]
            owners.append((s.seq, s.prompt_rows.start, len(s.prompt_rows)))
        if not rows:
            return None
        return cls(rows, targets, owners, max(seq.params.prompt_logprobs for seq, _, _ in owners))


@dataclass
class PromptScores:
    """A step's prompt-row results on the device: the prompt token's logprob and rank, the top-k alternatives."""

    plan: PromptRowsPlan
    logprobs: torch.Tensor  # [R] float32
    ranks: torch.Tensor  # [R] int64
    top_ids: torch.Tensor  # [R, k] int64
    top_logprobs: torch.Tensor  # [R, k] float32

    def tensors(self) -> tuple[torch.Tensor, ...]:
        return self.logprobs, self.ranks, self.top_ids, self.top_logprobs

    @staticmethod
    def results(plan: PromptRowsPlan, host: tuple[torch.Tensor, ...]) -> dict[int, PromptStepResult]:
        """PromptStepResult per sequence (by seq_id) from the host copies of `tensors()`; top-k cut to each
        request's own count. tolist keeps every float32 value exactly."""
        lps, ranks, ids, vals = (t.tolist() for t in host)
        out, i = {}, 0
        for seq, first, n in plan.owners:
            k = seq.params.prompt_logprobs
            tops = [{ids[r][j]: vals[r][j] for j in range(k)} for r in range(i, i + n)]
            out[seq.seq_id] = PromptStepResult(first, lps[i:i + n], ranks[i:i + n], tops)
            i += n
        return out


def score_prompt_rows(logits_of, plan: PromptRowsPlan, ops) -> PromptScores:
    """The prompt rows' logprobs through `ops.log_softmax`, the sampler's (sampler.py), so decode's bits;
    `logits_of(a, b)` gives the float32 logits of plan rows [a, b), computed ROWS_PER_SLICE at a time."""
    parts = []
    for a in range(0, len(plan.rows), ROWS_PER_SLICE):
        b = min(a + ROWS_PER_SLICE, len(plan.rows))
        logprobs = ops.log_softmax(logits_of(a, b), dim=-1)
        picked = logprobs.gather(1, to_device(plan.targets[a:b], torch.int64, logprobs.device)[:, None])
        parts.append((picked[:, 0], token_ranks(logprobs, picked), *top_k_logprobs(logprobs, plan.k)))
    return PromptScores(plan, *(torch.cat(column) for column in zip(*parts)))
