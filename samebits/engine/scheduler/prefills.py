"""Prefill fairness: a short prompt is not held behind a long one's prefill (vLLM's knobs, the dynamic policy's use).

While another sequence waits that could use the rest of the step (or another prefill runs), one prefill chunk takes
at most `long_prefill_token_threshold` tokens of a step, so newcomers get budget every step; decodes keep their token
in any case (policies.py). A prefill that spans steps is a *partial*
prefill: at most `max_num_partial_prefills` of them run at once, and of those at most `max_long_partial_prefills`
are longer than the threshold, so a waiting long prompt is passed over (it waits for the current one) while a prompt
that finishes its prefill in the step is admitted at once. Like every scheduling choice this changes only which rows
run together, never what a row computes.
"""
from __future__ import annotations

from dataclasses import dataclass

from samebits.engine.sequence import Sequence


@dataclass(frozen=True)
class PrefillLimits:
    """EngineConfig's three fields; `threshold` None: half the step's token budget, 0: no cap."""

    threshold: int | None = None
    max_partial: int = 1
    max_long_partial: int = 1

    @classmethod
    def from_config(cls, config) -> PrefillLimits:
        return cls(config.long_prefill_token_threshold, config.max_num_partial_prefills,
                   config.max_long_partial_prefills)

    def cap(self, budget: int) -> int:
        """Tokens one prefill chunk may take of a step while others could use the rest; 0: no cap."""
        return max(1, budget // 2) if self.threshold is None else self.threshold


class PartialPrefills:
    """One plan's count of the prefills that span steps, and whether a newcomer may start one."""

    def __init__(self, limits: PrefillLimits, cap: int, running: list[Sequence]):
        self.limits, self.cap = limits, cap
        partial = [s for s in running if s.in_prefill]
        self.total = len(partial)
        self.long = sum(self._is_long(s.num_uncomputed) for s in partial)

    def _is_long(self, tokens: int) -> bool:
        return 0 < self.cap < tokens

    def may_start(self, seq: Sequence, remaining: int, n: int) -> bool:
        """Whether seq, with `remaining` tokens to compute and a first chunk of n, may start now."""
        if n >= remaining:  # its prefill ends in this step: it holds no partial slot
            return True
        if self.total >= self.limits.max_partial:
            return False
        return not self._is_long(remaining) or self.long < self.limits.max_long_partial

    def started(self, seq: Sequence) -> None:
        """seq was admitted; count it if its prefill goes on past this step."""
        if seq.in_prefill:
            self.total += 1
            self.long += self._is_long(seq.num_uncomputed)
