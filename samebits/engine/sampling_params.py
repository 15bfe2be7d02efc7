"""Per-request sampling parameters, validated once so the engine never sees a bad value."""
from __future__ import annotations

import math
from dataclasses import dataclass
from functools import cached_property

MAX_LOGPROBS = 20
SEED_LIMIT = 2**63  # seeds travel through int64 tensors and JSON, so they must fit a signed 64-bit int


def _is_int(value) -> bool:
    # bool is an int subclass; True as max_tokens is a caller bug, not a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    logprobs: int | None = None

    def __post_init__(self) -> None:
        self._check_floats()
        self._check_counts()
        self._check_stops()
        _require(isinstance(self.ignore_eos, bool), f"ignore_eos must be a bool, got {self.ignore_eos!r}")

    def _check_floats(self) -> None:
        t, p, m = self.temperature, self.top_p, self.min_p
        _require(_is_real(t) and math.isfinite(t) and t >= 0, f"temperature must be finite and >= 0, got {t!r}")
        _require(_is_real(p) and 0 < p <= 1, f"top_p must be in (0, 1], got {p!r}")
        _require(_is_real(m) and 0 <= m <= 1, f"min_p must be in [0, 1], got {m!r}")

    def _check_counts(self) -> None:
        k, mt, n, lp, s = self.top_k, self.max_tokens, self.n, self.logprobs, self.seed
        _require(_is_int(k) and (k == -1 or k >= 1), f"top_k must be -1 (off) or >= 1, got {k!r}")
        _require(_is_int(mt) and mt >= 1, f"max_tokens must be an int >= 1, got {mt!r}")
        _require(_is_int(n) and n >= 1, f"n must be an int >= 1, got {n!r}")
        lp_ok = lp is None or (_is_int(lp) and 0 <= lp <= MAX_LOGPROBS)
        _require(lp_ok, f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {lp!r}")
        seed_ok = s is None or (_is_int(s) and 0 <= s < SEED_LIMIT)
        _require(seed_ok, f"seed must be None or an int in [0, 2**63), got {s!r}")

    def _check_stops(self) -> None:
        stop, ids = self.stop, self.stop_token_ids
        stop_ok = stop is None or isinstance(stop, str) or (
            isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop))
        _require(stop_ok, f"stop must be None, a str or a list of str, got {stop!r}")
        _require(not any(s == "" for s in self.stop_strings), "stop strings must be non-empty")
        ids_ok = ids is None or (isinstance(ids, (list, tuple)) and all(_is_int(i) and i >= 0 for i in ids))
        _require(ids_ok, f"stop_token_ids must be None or a list of ints >= 0, got {ids!r}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    @cached_property  # read every step by the scheduler; cached_property works on frozen dataclasses
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @cached_property
    def stop_token_set(self) -> frozenset[int]:
        return frozenset(self.stop_token_ids or ())
