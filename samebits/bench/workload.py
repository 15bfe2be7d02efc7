"""The benchmark's workload: random prompts and output lengths from one seed, every request submitted at t=0."""
from __future__ import annotations

import random
from dataclasses import dataclass

from samebits.engine.sampling_params import SamplingParams


@dataclass(frozen=True)
class Workload:
    prompts: list[list[int]]
    max_tokens: list[int]

    def __len__(self) -> int:
        return len(self.prompts)

    def warmup(self, n: int, max_tokens: int) -> Workload:
        """The first `n` prompts reversed, each asking `max_tokens`: the same shapes, but none of their blocks, so
        the timed load after it finds nothing of its own in the prefix cache."""
        return Workload([p[::-1] for p in self.prompts[:n]], [max_tokens] * min(n, len(self)))


def workload(n: int, seed: int, prompt_range: tuple[int, int], output_range: tuple[int, int], vocab: int) -> Workload:
    rng = random.Random(seed)
    prompts = [[rng.randrange(vocab) for _ in range(rng.randint(*prompt_range))] for _ in range(n)]
    return Workload(prompts, [rng.randint(*output_range) for _ in range(n)])


def request_params(index: int, max_tokens: int, seed: int) -> SamplingParams:
    """Request `index`'s sampling, the same inside the load and re-run alone: its own seed, exactly `max_tokens`."""
    return SamplingParams(temperature=0.8, seed=seed + index, max_tokens=max_tokens, logprobs=0, ignore_eos=True)
