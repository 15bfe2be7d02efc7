"""sampled: bs1 vs bsN with temperature > 0 and a `seed`, once two solo requests show the endpoint honours it.

Sampling adds what greedy decoding hides: the random draw itself must not depend on the batch (a counter-based
RNG keyed by the request does not; one generator shared by the batch does).
"""
from __future__ import annotations

from samebits.check.compare import compare
from samebits.check.config import CheckConfig
from samebits.check.experiment import Session, Trace
from samebits.check.needle import needle_prompt, sweep

NAME = "sampled"


def planned(cfg: CheckConfig) -> int:
    return 2 + cfg.trials * sum(cfg.concurrency)


async def run(session: Session, trace: Trace) -> None:
    cfg = session.cfg
    req = session.request(needle_prompt(session), temperature=cfg.temperature, seed=cfg.seed + 1)
    first = await session.send(req)
    diff = compare(first, await session.send(req), cfg.tolerance)
    if not diff.same:
        # Either the seed is ignored or the endpoint is not even run-to-run deterministic (repeat tells which);
        # bursts could not say anything about batching then.
        trace.skipped = f"seed not honoured: two solo requests with seed {cfg.seed + 1} differ at position " \
                        f"{diff.first_divergence}"
        return
    await sweep(session, trace, req, first, cfg.temperature)
