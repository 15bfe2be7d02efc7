"""Token ids and logprob values compared exactly as the endpoint sent them; a tolerance only when asked for.

Logprobs are the float64 values of the JSON text, so two different decimal strings never compare equal; -0.0 and
0.0 differ, as their bits do.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from samebits.check.sample import Sample


def same_value(a: float | None, b: float | None, tolerance: float) -> bool:
    if a is None or b is None:
        return a is b
    if tolerance:
        return abs(a - b) <= tolerance
    return a == b and math.copysign(1.0, a) == math.copysign(1.0, b)


@dataclass(frozen=True)
class Diff:
    first_divergence: int | None  # first position whose token or logprob differs; None when the samples agree
    token_divergence: int | None  # first position whose token differs (or where one sample ends)
    max_abs_delta: float  # over positions before token_divergence, where both contexts are still the same

    @property
    def same(self) -> bool:
        return self.first_divergence is None


def compare(ref: Sample, obs: Sample, tolerance: float = 0.0) -> Diff:
    common = min(len(ref.tokens), len(obs.tokens))
    token_div = next((i for i in range(common) if ref.tokens[i] != obs.tokens[i]), None)
    if token_div is None and len(ref.tokens) != len(obs.tokens):
        token_div = common
    aligned = common if token_div is None else token_div
    pairs = list(zip(ref.logprobs[:aligned], obs.logprobs[:aligned]))
    lp_div = next((i for i, (a, b) in enumerate(pairs) if not same_value(a, b, tolerance)), None)
    deltas = [abs(a - b) for a, b in pairs if a is not None and b is not None]
    first = min((i for i in (token_div, lp_div) if i is not None), default=None)
    return Diff(first, token_div, max(deltas, default=0.0))


@dataclass(frozen=True)
class GroupStats:
    """One prompt under one condition: its reference and the observations that should equal it."""

    label: str
    observations: int
    diverged: int
    unique_outputs: int
    first_divergence: int | None
    token_divergence: int | None
    max_abs_delta: float
    level: int | None = None  # the concurrency the observations ran at, for the divergence-vs-concurrency plot

    def __post_init__(self) -> None:
        if not 0 <= self.diverged <= self.observations:
            raise ValueError(f"diverged ({self.diverged}) must be within [0, observations ({self.observations})]")

    @property
    def variant(self) -> bool:
        return self.diverged > 0

    def as_dict(self) -> dict:
        return {"label": self.label, "observations": self.observations, "diverged": self.diverged,
                "unique_outputs": self.unique_outputs, "first_divergence": self.first_divergence,
                "token_divergence": self.token_divergence, "max_abs_delta": self.max_abs_delta, "level": self.level}


def _key(s: Sample) -> tuple:
    # repr keeps -0.0 apart from 0.0, so "unique as sent" agrees with same_value at tolerance 0.
    return s.tokens, tuple(repr(v) for v in s.logprobs)


def summarize(label: str, ref: Sample, observations: list[Sample], tolerance: float = 0.0,
              level: int | None = None) -> GroupStats:
    diffs = [compare(ref, o, tolerance) for o in observations]
    bad = [d for d in diffs if not d.same]
    return GroupStats(label, len(observations), len(bad), len({_key(s) for s in [ref, *observations]}),
                      min((d.first_divergence for d in bad), default=None),
                      min((d.token_divergence for d in bad if d.token_divergence is not None), default=None),
                      max((d.max_abs_delta for d in diffs), default=0.0), level)
