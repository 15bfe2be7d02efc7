"""The engine's side of the comparison: rollout logprobs from an `LLM`, raw or under the sampling distribution.

`generate` reports the raw logprob of each sampled token and `score` recomputes it teacher-forced (same bits).
The sampling distribution's logprob needs the whole logits row, which neither returns: `engine_logprobs` runs the
engine's runner over the sequence exactly as `LLMEngine.score` does (the scheduler's scoring blocks, chunks of
max_num_batched_tokens) and applies rl/sampling.py with the engine's own ops.
"""
from __future__ import annotations

import contextlib

import torch

from samebits.engine.sampling_params import SamplingParams
from samebits.engine.scheduler import ScheduledSeq
from samebits.rl.sampling import per_row_params, token_logprobs


def completions_of(outputs) -> tuple[list[list[int]], list[list[float]]]:
    """Token ids and reported logprobs of every sample of `LLM.generate`'s outputs, in order."""
    tokens = [list(c.token_ids) for out in outputs for c in out.outputs]
    return tokens, [list(c.token_logprobs) for out in outputs for c in out.outputs]


def engine_logprobs(llm, prompts: list[list[int]], completions: list[list[int]],
                    sampling_params=None) -> list[torch.Tensor]:
    """Per sequence, [len(completion)] float32 logprobs computed by the engine: raw (None) or under a SamplingParams
    (one, or one per sequence). Needs an idle engine, as `LLM.score` does."""
    params = per_row_params(sampling_params, completions)
    out, at = [], 0
    with _runtime(llm.config.mode):
        for p, c in zip(prompts, completions):
            rows = None if params is None else params[at:at + len(c)]
            out.append(_score(llm.engine, list(p), list(c), rows))
            at += len(c)
    return out


def _runtime(mode: str):
    if mode != "deterministic":
        return contextlib.nullcontext()
    from samebits.runtime import deterministic_runtime

    return deterministic_runtime()


@torch.inference_mode()
def _score(engine, prompt: list[int], completion: list[int], params) -> torch.Tensor:
    if not prompt or not completion:
        raise ValueError("prompt and completion must both be non-empty")
    engine.validate(prompt, SamplingParams(max_tokens=len(completion)))
    runner, model = engine.runner, engine.runner.model
    tokens = prompt + completion
    first = len(prompt) - 1  # the row that predicts the first completion token
    logits = []
    with engine.scheduler.scoring_blocks(tokens[:-1]) as seq:
        start = 0  # cached rows are recomputed too: they rewrite the identical KV bits (as LLMEngine.score)
        while start < seq.num_tokens:
            n = min(engine.config.max_num_batched_tokens, seq.num_tokens - start)
            hidden = runner.forward([ScheduledSeq(seq, n, False, start)])
            keep = hidden[max(0, first - start):]
            if keep.shape[0]:
                logits.append(model.compute_logits(keep))
            start += n
            engine.scheduler.mark_computed(seq, start)
    targets = torch.tensor(completion, dtype=torch.int64, device=model.device)
    return token_logprobs(torch.cat(logits), targets, model.ops, params).cpu()
