"""The "bucketed" policy: the fixed-shape serving of seed §6.1-6.2 (docs/BACKGROUND.md), without invariant kernels.

A step is either a *prefill* step of ONE sequence whose chunk is padded up to a length bucket (16, 32, 64, ...
<= budget), or a *decode* step of 1 token per sequence whose row count is padded up to a batch bucket (8, 16, 32,
..., max_num_seqs). Steps alternate when both kinds are ready. Short batches are padded, never held back: waiting
would add latency without narrowing the shapes any further. Padding rows are dummy sequences (Plan.padding) that the
runner appends after the real rows, so causal attention keeps them out of every real row.
"""
from __future__ import annotations

import bisect
import itertools
from collections.abc import Iterable

from samebits.engine.scheduler.batch import ScheduledSeq
from samebits.engine.scheduler.policies import Plan, Planner
from samebits.engine.sequence import Sequence, SequenceStatus


def doubling(first: int) -> Iterable[int]:
    return (first << i for i in itertools.count())


def capped_ladder(sizes: Iterable[int], limit: int) -> tuple[int, ...]:
    """The increasing `sizes` below `limit`, then `limit`: padded batch sizes that always reach the largest batch."""
    return tuple(itertools.takewhile(lambda b: b < limit, sizes)) + (limit,)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket >= n."""
    return buckets[bisect.bisect_left(buckets, n)]


def default_length_buckets(budget: int) -> tuple[int, ...]:
    return tuple(itertools.takewhile(lambda b: b <= budget, doubling(16))) or (budget,)


def default_batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    return capped_ladder(doubling(8), max_num_seqs)


class BucketedPolicy:
    name = "bucketed"

    def __init__(self, max_num_seqs: int, max_num_batched_tokens: int, length_buckets: tuple[int, ...] | None = None,
                 batch_buckets: tuple[int, ...] | None = None):
        self.length_buckets = tuple(length_buckets or default_length_buckets(max_num_batched_tokens))
        self.batch_buckets = tuple(batch_buckets or default_batch_buckets(max_num_seqs))
        self._validate(max_num_seqs, max_num_batched_tokens)
        self._last_kind = "empty"

    def _validate(self, max_num_seqs: int, max_num_batched_tokens: int) -> None:
        lb, bb = self.length_buckets, self.batch_buckets
        if list(lb) != sorted(set(lb)) or lb[-1] > max_num_batched_tokens:
            raise ValueError(f"length buckets must increase and stay <= max_num_batched_tokens, got {lb}")
        if list(bb) != sorted(set(bb)) or bb[-1] < max_num_seqs:
            raise ValueError(f"batch buckets must increase and reach max_num_seqs={max_num_seqs}, got {bb}")
        if bb[-1] > max_num_batched_tokens:
            raise ValueError(f"max_num_batched_tokens must be >= the largest batch bucket {bb[-1]} under "
                             f"policy='bucketed', got {max_num_batched_tokens}")

    def plan(self, sched: Planner, preempted: list[Sequence]) -> Plan:
        """The kind is the step's shape family, so a 1-token prompt admitted in a prefill step is a padded prefill."""
        has_decode = any(s.num_uncomputed == 1 for s in sched.running)
        decode_first = has_decode and self._last_kind == "prefill"  # alternate so neither kind starves
        plan = Plan([], "empty")
        for kind in (("decode", "prefill") if decode_first else ("prefill", "decode")):
            plan = self._prefill(sched, preempted) if kind == "prefill" else self._decode(sched, preempted)
            if plan.scheduled:
                break
        self._last_kind = plan.kind
        return plan

    def _prefill(self, sched: Planner, preempted: list[Sequence]) -> Plan:
        longest = self.length_buckets[-1]
        seq = next((s for s in sched.running if s.in_prefill), None)
        if seq is not None:
            item = sched.grow(seq, min(seq.num_uncomputed, longest), preempted)
        else:
            item = None if preempted else sched.admit(longest, longest)
        if item is None:
            return Plan([], "empty")
        pad = bucket_for(item.num_new_tokens, self.length_buckets) - item.num_new_tokens
        return Plan([item], "prefill", (pad,) if pad else ())

    def _decode(self, sched: Planner, preempted: list[Sequence]) -> Plan:
        scheduled: list[ScheduledSeq] = []
        for seq in list(sched.running):
            if len(scheduled) == self.batch_buckets[-1]:
                break
            if seq.status is SequenceStatus.RUNNING and seq.num_uncomputed == 1:
                item = sched.grow(seq, 1, preempted)
                scheduled += [item] if item is not None else []
        if not scheduled:
            return Plan([], "empty")
        return Plan(scheduled, "decode", (1,) * (bucket_for(len(scheduled), self.batch_buckets) - len(scheduled)))
