"""prefix: the same prompt with its long prefix cold (never sent), hot (sent just before) and inside one burst of
prompts that share all, part or none of it.

A prefix cache that reuses KV computed in another batch, or in chunks of another size, changes the bits unless the
kernels are invariant to both; the hot and mixed answers must equal the cold one.
"""
from __future__ import annotations

import random
import secrets

from samebits.check.compare import summarize
from samebits.check.config import CheckConfig
from samebits.check.experiment import Request, Session, Trace
from samebits.check.prompts import filler, words

NAME = "prefix"
MIXED_MAX = 16


def mixed_size(cfg: CheckConfig) -> int:
    return max(2, min(cfg.concurrency[-1], MIXED_MAX))


def planned(cfg: CheckConfig) -> int:
    return 3 + mixed_size(cfg)


def _mixed(session: Session, prefix: str, target: Request) -> tuple[list[Request], int]:
    cfg, rng = session.cfg, session.rng
    cut = prefix.split()
    batch = []
    for _ in range(mixed_size(cfg) - 1):
        kind = rng.choice(("full", "part", "none"))
        head = prefix if kind == "full" else " ".join(cut[:rng.randint(1, len(cut))]) if kind == "part" else ""
        batch.append(session.request(f"{head} {filler(rng, cfg.filler_words)}".strip()))
    pos = rng.randrange(len(batch) + 1)
    batch.insert(pos, target)
    return batch, pos


async def run(session: Session, trace: Trace) -> None:
    cfg = session.cfg
    # A fresh prefix per run (not from --seed): one from an earlier run could still sit in the server's cache.
    fresh = random.Random(secrets.randbits(64))
    prefix = words(fresh, cfg.prefix_words)
    target = session.request(f"{prefix} {words(fresh, 8)}")
    cold = await session.send(target)
    session.keep_reference(NAME, target, cold)
    await session.send(session.request(f"{prefix} {words(fresh, 8)}"))
    hot = await session.send(target)
    trace.groups.append(summarize("hot vs cold", cold, [hot], cfg.tolerance))
    batch, pos = _mixed(session, prefix, target)
    mixed = (await session.burst(batch))[pos]
    trace.groups.append(summarize(f"mixed burst of {len(batch)} vs cold", cold, [mixed], cfg.tolerance))
