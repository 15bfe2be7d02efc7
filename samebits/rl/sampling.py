"""The two distributions RL compares a token under, from logits rows, one function for the engine and the trainer.

- raw: log_softmax of the model's logits, what `LLM.generate` reports and `LLM.score` returns;
- sampling: the distribution the sampler drew from (engine/sampler.py): logits / temperature, then top-k, top-p and
  min-p as -inf (its `filter_logits`), normalised by the same `log_softmax`. A greedy row (temperature below the
  sampler's GREEDY_TEMPERATURE) draws its argmax with certainty: logprob 0 there, -inf elsewhere.
Both sides call these with their own ops (the engine's `Ops`, the trainer's `TrainOps`, whose forward is the same),
so equal logits give equal logprob bits. The filter's thresholds are computed on detached values: which tokens are
kept is not differentiable, the kept tokens' logprobs are.
"""
from __future__ import annotations

import torch

from samebits.engine.sampler import GREEDY_TEMPERATURE, filter_logits
from samebits.kernels.common import to_device


def raw_logprobs(logits: torch.Tensor, ops) -> torch.Tensor:
    """[N, V] float32 log_softmax of the raw logits."""
    return ops.log_softmax(logits, dim=-1)


def sampling_logprobs(logits: torch.Tensor, params: list, ops) -> torch.Tensor:
    """[N, V] float32 logprobs of the sampling distribution of row i under params[i] (a SamplingParams)."""
    if len(params) != logits.shape[0]:
        raise ValueError(f"sampling_params: {len(params)} rows of parameters for {logits.shape[0]} rows of logits")
    greedy = [p.temperature < GREEDY_TEMPERATURE for p in params]
    # A greedy row is divided by 1 (its result is replaced below): logits / 1e-6 would overflow.
    t = to_device([1.0 if g else p.temperature for p, g in zip(params, greedy)], torch.float32, logits.device)
    scaled = logits / t[:, None]
    with torch.no_grad():
        kept = filter_logits(scaled.detach(), [p.top_k for p in params], [p.top_p for p in params],
                             [p.min_p for p in params], getattr(ops, "base", ops))
    logprobs = ops.log_softmax(scaled.masked_fill(torch.isneginf(kept), float("-inf")), dim=-1)
    if not any(greedy):
        return logprobs
    point = torch.full_like(logprobs, float("-inf")).scatter_(1, logits.argmax(dim=-1, keepdim=True), 0.0)
    rows = to_device(greedy, torch.bool, logits.device)[:, None]
    return torch.where(rows, point.detach(), logprobs)


def token_logprobs(logits: torch.Tensor, targets: torch.Tensor, ops, params: list | None = None) -> torch.Tensor:
    """[N] logprob of targets[i] under row i: raw when params is None, else the sampling distribution."""
    table = raw_logprobs(logits, ops) if params is None else sampling_logprobs(logits, params, ops)
    return table.gather(1, targets[:, None])[:, 0]


def per_row_params(sampling_params, completions) -> list | None:
    """One SamplingParams per logits row (a sequence's rows share its own), or None for the raw distribution."""
    if sampling_params is None:
        return None
    per_seq = sampling_params if isinstance(sampling_params, (list, tuple)) else [sampling_params] * len(completions)
    if len(per_seq) != len(completions):
        raise ValueError(f"sampling_params: got {len(per_seq)} for {len(completions)} sequences; give one or one each")
    return [p for p, c in zip(per_seq, completions) for _ in c]
