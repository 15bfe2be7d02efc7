"""Requests re-run alone vs inside the full load, token ids and logprob bits: how many differ. Deterministic mode
must count 0; fast mode is the negative control that counts more."""
from __future__ import annotations

from collections.abc import Callable

import torch

from samebits.bench.workload import Workload, request_params

COMPARED_TOKENS = 16  # the first tokens of each re-run: enough to pass prefill and several decode steps


def picks(n: int, count: int) -> list[int]:
    """`count` requests spread evenly over the workload's `n`."""
    return list(range(0, n, max(1, n // count)))[:count] if count else []


def bits(out, k: int) -> tuple[list[int], list[int]]:
    """The first `k` token ids and their logprobs' float32 bits."""
    c = out.outputs[0]
    return c.token_ids[:k], torch.tensor(c.token_logprobs[:k], dtype=torch.float32).view(torch.int32).tolist()


def alone_vs_loaded(engine, work: Workload, loaded: list, chosen: list[int], seed: int = 0,
                    k: int = COMPARED_TOKENS, checked: Callable[[], None] | None = None) -> int:
    """Each chosen request re-run alone (its first k tokens, same seed) and compared with `loaded[i]`."""
    bad = 0
    for i in chosen:
        n = min(k, work.max_tokens[i])
        engine.add_request(f"alone-{i}", work.prompts[i], request_params(i, n, seed))
        out = None
        while engine.has_unfinished_requests():
            for o in engine.step():
                out = o if o.finished else out
        bad += bits(out, n) != bits(loaded[i], n)
        if checked is not None:
            checked()
    return bad
