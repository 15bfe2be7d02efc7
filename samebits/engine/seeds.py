"""The engine's one seed stream: a request that sends no seed gets the next draw (`EngineConfig.seed`), or a fresh
one when no seed is configured. Every drawn seed is reported back, so the request can be replayed."""
from __future__ import annotations

import random
import secrets

from samebits.engine.config import SEED_LIMIT

# getrandbits, not randrange: the stream of seeds drawn under config.seed must stay the one it always was.
SEED_BITS = SEED_LIMIT.bit_length() - 1


class SeedStream:
    def __init__(self, seed: int | None):
        self._rng = random.Random(seed) if seed is not None else None

    def draw(self) -> int:
        return self._rng.getrandbits(SEED_BITS) if self._rng else secrets.randbits(SEED_BITS)
