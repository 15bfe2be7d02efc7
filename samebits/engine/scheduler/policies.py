"""Scheduling policies: given the scheduler's queues and budget, pick one step's chunks (and any padding rows).

A policy decides only *which* tokens run together, through the scheduler's `grow` and `admit`; the scheduler keeps
every piece of state (queues, blocks, preemption). "bucketed" lives in bucketed.py.
"""
from __future__ import annotations

from typing import NamedTuple, Protocol

from samebits.engine.scheduler.batch import ScheduledSeq
from samebits.engine.sequence import Sequence


class Planner(Protocol):
    """What a policy may use of the scheduler (Scheduler implements it)."""

    running: list[Sequence]

    def grow(self, seq: Sequence, n: int, preempted: list[Sequence]) -> ScheduledSeq | None: ...

    def admit(self, budget: int, max_chunk: int | None = None) -> ScheduledSeq | None: ...


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
    prefill (or a recompute after preemption) takes what the budget leaves; then waiting sequences are admitted FCFS.
    Decodes come before prefills without a separate pass: a newcomer is only admitted with budget to spare, so every
    running prefill is younger than every running decode (the soak test checks this) -- except for a sequence passed
    over while its request held its cap of running slots (scheduler.py), whose later prefill may precede younger
    decodes. Iterating in arrival order keeps preemption safe: the victim (the latest arrival) is never a sequence
    already scheduled in this step."""

    name = "dynamic"

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int):
        self.budget = max_num_batched_tokens

    def plan(self, sched: Planner, preempted: list[Sequence]) -> Plan:
        budget, scheduled = self.budget, []
        for seq in list(sched.running):
            if budget == 0:
                break
            item = sched.grow(seq, min(seq.num_uncomputed, budget), preempted)
            if item is not None:
                scheduled.append(item)
                budget -= item.num_new_tokens
        # vLLM's rule: a step that had to preempt admits nobody, or the victim's blocks go straight to a newcomer.
        while not preempted and budget > 0:
            item = sched.admit(budget)
            if item is None:
                break
            scheduled.append(item)
            budget -= item.num_new_tokens
        return Plan(scheduled, step_kind(scheduled))
