"""Scheduling policies: given the scheduler's queues and budget, pick one step's chunks (and any padding rows).

A policy decides only *which* tokens run together, through the scheduler's `grow` and `admit`; the scheduler keeps
every piece of state (queues, blocks, preemption). "bucketed" lives in bucketed.py.
"""
from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple, Protocol

from samebits.engine.scheduler.batch import ScheduledSeq
from samebits.engine.scheduler.prefills import PartialPrefills, PrefillLimits
from samebits.engine.sequence import Sequence


class Planner(Protocol):
    """What a policy may use of the scheduler (Scheduler implements it)."""

    running: list[Sequence]
    waiting: list[Sequence]

    def grow(self, seq: Sequence, n: int, preempted: list[Sequence]) -> ScheduledSeq | None: ...

    def admit(self, budget: int, max_chunk: int | None = None,
              may_start: Callable[[Sequence, int, int], bool] | None = None) -> ScheduledSeq | None: ...


class Plan(NamedTuple):
    scheduled: list[ScheduledSeq]
    kind: str  # "empty" | "prefill" | "decode" | "mixed"
    # Token counts of dummy sequences run after the real ones, so the step's shape is fixed (bucketed only).
    padding: tuple[int, ...] = ()


def step_kind(scheduled: list[ScheduledSeq]) -> str:
    decodes = sum(s.is_decode for s in scheduled)
    if not scheduled:
        return "empty"
    return "decode" if decodes == len(scheduled) else "prefill" if decodes == 0 else "mixed"


class DynamicPolicy:
    """vLLM-v1 style unified step. Running sequences first (oldest first), one chunk each: a decode is 1 token, a
    prefill (or a recompute after preemption) takes what the budget leaves, less a token for each decode after it,
    and at most the long-prefill cap (prefills.py) while someone could use the rest; then waiting sequences are
    admitted FCFS, passing over one that would start a partial prefill beyond the limits. So a decode always gets its
    token, even behind an older sequence's prefill, and a short prompt behind a long one starts at the next step. Iterating in
    arrival order keeps preemption safe: the victim (the latest arrival) is never a sequence already scheduled in this
    step."""

    name = "dynamic"

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, prefill: PrefillLimits | None = None):
        self.budget = max_num_batched_tokens
        self.limits = prefill or PrefillLimits()
        self.cap = self.limits.cap(max_num_batched_tokens)

    def plan(self, sched: Planner, preempted: list[Sequence]) -> Plan:
        budget, scheduled = self.budget, []
        running = list(sched.running)
        cap = self._cap_for(sched)
        for seq, decodes_after in zip(running, _decodes_after(running)):
            if budget == 0:
                break
            n = _chunk(seq.num_uncomputed, budget - decodes_after, cap) if seq.in_prefill else 1
            item = sched.grow(seq, n, preempted) if n > 0 else None
            if item is not None:
                scheduled.append(item)
                budget -= item.num_new_tokens
        partial = PartialPrefills(self.limits, cap, sched.running)
        # vLLM's rule: a step that had to preempt admits nobody, or the victim's blocks go straight to a newcomer.
        while not preempted and budget > 0:
            item = sched.admit(budget, cap or None, partial.may_start)
            if item is None:
                break
            partial.started(item.seq)
            scheduled.append(item)
            budget -= item.num_new_tokens
        return Plan(scheduled, step_kind(scheduled))

    def _cap_for(self, sched: Planner) -> int:
        """The cap while the budget it leaves can go to someone: another running prefill, or a waiting sequence
        that would finish its prefill in one chunk or that the partial-prefill limits let start beside the prefills
        that the cap keeps partial. Else 0: a prefill beside decodes only (each keeps its token
        anyway) or beside long prompts the limits pass over takes the whole budget, not half of an empty step."""
        prefills, others = [s for s in sched.running if s.in_prefill], list(sched.waiting)
        if not prefills and others:
            prefills.append(others.pop(0))  # the oldest waiting sequence takes this step's first prefill chunk
        if not self.cap or len(prefills) > 1:
            return self.cap
        staying = PartialPrefills(self.limits, self.cap, [s for s in prefills if s.num_uncomputed > self.cap])
        usable = any(staying.may_start(w, w.num_uncomputed, min(w.num_uncomputed, self.cap)) for w in others)
        return self.cap if usable else 0


def _chunk(remaining: int, budget: int, cap: int) -> int:
    return min(remaining, budget, cap) if cap else min(remaining, budget)


def _decodes_after(running: list[Sequence]) -> list[int]:
    """For each running sequence, how many after it have one token to compute: a prefill leaves them a token each."""
    counts, later = [], 0
    for seq in reversed(running):
        counts.append(later)
        later += not seq.in_prefill
    return counts[::-1]
