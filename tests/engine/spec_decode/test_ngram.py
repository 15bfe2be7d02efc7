"""Prompt lookup: vLLM's rule (the longest suffix n-gram in [min, max] at its earliest earlier occurrence, then up to
k tokens), against a brute-force reading of that rule."""
import random

import numpy as np

from samebits.engine.sequence import Sequence
from samebits.engine.spec_decode.ngram import NgramDrafter, lookup


def by_the_rule(tokens: list[int], min_n: int, max_n: int, k: int) -> list[int]:
    for n in range(min(max_n, len(tokens) - 1), min_n - 1, -1):
        suffix = tokens[-n:]
        for start in range(len(tokens) - n):
            if tokens[start:start + n] == suffix:
                return tokens[start + n:start + n + k]
    return []


def test_vllms_example():
    # vLLM's NgramProposer docstring: [4, 2, 3] has no earlier match, [2, 3] has one; 3 tokens follow it.
    assert lookup(np.array([1, 2, 3, 4, 2, 3]), 2, 3, 4) == [4, 2, 3]
    assert lookup(np.array([1, 2, 3, 4, 2, 3]), 3, 3, 4) == []
    assert lookup(np.array([7]), 1, 1, 4) == [] and lookup(np.array([7, 7]), 1, 1, 4) == [7]


def test_matches_the_rule_on_random_sequences(seed):
    rng = random.Random(seed)
    for _ in range(300):
        tokens = [rng.randrange(rng.choice([2, 4, 50])) for _ in range(rng.randint(1, 80))]
        low = rng.randint(1, 4)
        high, k = rng.randint(low, 6), rng.randint(1, 8)
        assert lookup(np.array(tokens), low, high, k) == by_the_rule(tokens, low, high, k), (tokens, low, high, k)


def test_drafter_follows_growing_sequences_and_forgets_the_rest():
    drafter = NgramDrafter(3, 1, 2)
    a, b = Sequence("a", [5, 6, 7, 5]), Sequence("b", [1, 2, 3])
    assert drafter.propose([a, b]) == {a.seq_id: [6, 7, 5]}
    a.token_ids += [6] * 100  # past the buffer's first size
    assert drafter.propose([a]) == {a.seq_id: [6, 6, 6]}
    assert set(drafter._buffers) == {a.seq_id}

