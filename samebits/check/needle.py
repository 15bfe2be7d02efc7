"""needle: one greedy prompt alone, then inside bursts of N concurrent random-length requests at a random position.

A batch-invariant endpoint answers the needle with the same tokens and logprob bits at every N; a server whose
kernels change their reduction order with the batch shape does not.
"""
from __future__ import annotations

import random

from samebits.check.compare import summarize
from samebits.check.config import CheckConfig
from samebits.check.experiment import Request, Session, Trace
from samebits.check.prompts import filler, words
from samebits.check.sample import Sample

NAME = "needle"


def planned(cfg: CheckConfig) -> int:
    return 1 + cfg.trials * sum(cfg.concurrency)


def needle_prompt(session: Session) -> str:
    # Drawn from its own stream, so every experiment and every run with this seed shares the needle.
    return words(random.Random(f"needle-{session.cfg.seed}"), session.cfg.needle_words)


def _fillers(session: Session, count: int, temperature: float) -> list[Request]:
    cfg, rng = session.cfg, session.rng
    # Longer outputs than the needle's keep it in mixed batches for its whole decode, not only its prefill.
    return [session.request(filler(rng, cfg.filler_words), temperature=temperature,
                            seed=rng.randrange(2**31) if temperature else None,
                            max_tokens=rng.randint(cfg.max_tokens, 2 * cfg.max_tokens)) for _ in range(count)]


async def sweep(session: Session, trace: Trace, needle: Request, ref: Sample, temperature: float) -> None:
    """`trials` bursts per concurrency level, the needle's answer in each compared with its solo `ref`."""
    cfg = session.cfg
    session.keep_reference(trace.name, needle, ref)
    for n in cfg.concurrency:
        seen = []
        for _ in range(cfg.trials):
            batch = _fillers(session, n - 1, temperature)
            pos = session.rng.randrange(n)
            batch.insert(pos, needle)
            seen.append((await session.burst(batch))[pos])
        trace.groups.append(summarize(f"N={n}", ref, seen, cfg.tolerance, level=n))


async def run(session: Session, trace: Trace) -> None:
    needle = session.request(needle_prompt(session))
    await sweep(session, trace, needle, await session.send(needle), 0.0)
