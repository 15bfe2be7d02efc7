"""The engine's one seed stream: a request that sends no seed gets the next draw (`EngineConfig.seed`), or a fresh
one when no seed is configured. Every drawn seed is reported back, so the request can be replayed."""
from __future__ import annotations

import random
import secrets

from samebits.errors import FieldError

# Seeds travel through int64 tensors (engine/rng.py) and JSON, so a seed is a non-negative signed 64-bit int.
SEED_LIMIT = 2**63
# getrandbits, not randrange: the stream of seeds drawn under config.seed must stay the one it always was.
SEED_BITS = SEED_LIMIT.bit_length() - 1


def check_seed(seed) -> None:
    """The one check of a seed, the engine's (EngineConfig.seed) and a request's (SamplingParams.seed): None (one is
    drawn) or an int in [0, SEED_LIMIT)."""
    if seed is not None and (isinstance(seed, bool) or not isinstance(seed, int) or not 0 <= seed < SEED_LIMIT):
        raise FieldError("seed", f"seed must be None or an int in [0, 2**63), got {seed!r}")


class SeedStream:
    def __init__(self, seed: int | None):
        self._rng = random.Random(seed) if seed is not None else None

    def draw(self) -> int:
        return self._rng.getrandbits(SEED_BITS) if self._rng else secrets.randbits(SEED_BITS)
