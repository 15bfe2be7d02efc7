"""Continuous batching under a token budget: chunked prefill, FCFS, prefix caching, preemption by recompute.

Torch-free. One step = `schedule()` -> the runner computes and samples -> the output processor decides which sequences
finish -> `apply(output, finished)`. The scheduler never decides a finish itself (aborts aside, which are commands);
it applies the output processor's decisions once, freeing blocks. A scheduled chunk counts as computed at once and
its draw holds a pending token slot (sequence.py), so with `max_inflight=2` the next step can be scheduled before this
one's draws are read back (async scheduling, engine/llm_engine.py); outputs are applied in the order scheduled.
Every decision here changes only *which* tokens run together, never what a token computes: in deterministic mode the
kernels make each row's bits independent of its neighbours, and the sampler keys on (seed, sample index, position).
Which chunks run together is the policy's choice (policies.py: "dynamic"; bucketed.py: "bucketed").
"""
from __future__ import annotations

import bisect
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from collections.abc import Sequence as Sequence_
from contextlib import contextmanager

from samebits.arith import cdiv
from samebits.engine.config import POLICIES
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.scheduler.batch import ScheduledSeq, SchedulerOutput
from samebits.engine.scheduler.block_manager import BlockManager, require
from samebits.engine.scheduler.bucketed import BucketedPolicy
from samebits.engine.scheduler.policies import DynamicPolicy
from samebits.engine.scheduler.prefills import PrefillLimits
from samebits.engine.sequence import FINISH_STATUS, Finish, Sequence, SequenceStatus, ends_by_length, make_sequences

_POLICY_TYPES = {p.name: p for p in (DynamicPolicy, BucketedPolicy)}
# One running slot in this many is kept from a request that holds all the others, so a request arriving behind one
# with many samples is admitted at the next step instead of after the first of them finishes (docs/SECURITY.md).
RESERVED_SLOT_EVERY = 16
# The prompt rows of a chunk that scores none: ranges are immutable, so one serves every chunk of every step.
_NO_ROWS = range(0)


class QueueFull(RuntimeError):
    """More requests are waiting than the limit allows; the request was not admitted (the server answers 429)."""

    def __init__(self, limit: int):
        super().__init__(f"the waiting queue is full ({limit} requests)")
        self.limit = limit

    def __reduce__(self):  # its argument, not its message, so it crosses the engine process's pipe
        return type(self), (self.limit,)


def make_policy(name: str, max_num_seqs: int, max_num_batched_tokens: int, **options):
    if name not in POLICIES:
        raise ValueError(f"policy must be one of {POLICIES}, got {name!r}")
    return _POLICY_TYPES[name](max_num_seqs, max_num_batched_tokens, **options)


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_model_len: int, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, policy: str = "dynamic", max_waiting: int | None = None,
                 max_inflight: int = 1, **policy_options):
        self.bm = block_manager
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.max_waiting = max_waiting
        self.max_inflight = max_inflight
        self.per_request_cap = max_num_seqs - max_num_seqs // RESERVED_SLOT_EVERY
        self.policy = make_policy(policy, max_num_seqs, max_num_batched_tokens, **policy_options)
        self._validate()
        self.waiting: list[Sequence] = []  # sorted by arrival, preempted ones included
        self.running: list[Sequence] = []  # sorted by arrival: the last one is the preemption victim
        self.requests: dict[str, list[Sequence]] = {}
        self._unadmitted: set[str] = set()  # requests none of whose samples has run yet (max_waiting counts these)
        self._arrivals = 0
        self._pending: list[SchedulerOutput] = []  # scheduled, not yet applied; oldest first
        self.num_preemptions = 0

    @classmethod
    def from_config(cls, config, num_blocks: int, max_model_len: int, max_inflight: int = 1) -> Scheduler:
        bm = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        options = {"prefill": PrefillLimits.from_config(config)} if config.policy == "dynamic" else {}
        return cls(bm, max_model_len=max_model_len, max_num_seqs=config.max_num_seqs,
                   max_num_batched_tokens=config.max_num_batched_tokens, policy=config.policy,
                   max_waiting=config.max_waiting, max_inflight=max_inflight, **options)

    def _validate(self) -> None:
        if self.max_inflight not in (1, 2):
            raise ValueError(f"max_inflight must be 1 or 2, got {self.max_inflight!r}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.bm.capacity_tokens < self.max_model_len:
            # Otherwise a lone sequence could outgrow the pool and preempt itself forever.
            raise ValueError(f"the KV cache holds {self.bm.capacity_tokens} tokens; it must hold at least "
                             f"max_model_len={self.max_model_len}")

    # ---- requests ------------------------------------------------------------------------------------------
    def can_add_request(self) -> bool:
        return self.max_waiting is None or len(self._unadmitted) < self.max_waiting

    def add_request(self, request_id: str, prompt_token_ids: list[int], params: SamplingParams,
                    seed: int | None = None) -> list[Sequence]:
        self._check_new_request(request_id, prompt_token_ids)
        seqs = make_sequences(request_id, prompt_token_ids, params, seed, arrival=self._arrivals)
        self._arrivals += len(seqs)
        self.requests[request_id] = seqs
        self._unadmitted.add(request_id)
        self.waiting.extend(seqs)  # arrivals only grow, so appending keeps the queue sorted
        return seqs

    def _check_new_request(self, request_id: str, prompt_token_ids: list[int]) -> None:
        if request_id in self.requests:
            raise ValueError(f"request_id {request_id!r} is already in flight")
        if not 1 <= len(prompt_token_ids) < self.max_model_len:
            raise ValueError(f"prompt has {len(prompt_token_ids)} tokens; it must have between 1 and "
                             f"max_model_len - 1 = {self.max_model_len - 1}")
        if not self.can_add_request():
            raise QueueFull(self.max_waiting)

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every sample of the request and free its KV blocks now. Unknown ids are ignored (idempotent).
        Not thread-safe: call between steps; an abort between schedule() and apply() is allowed."""
        seqs = [s for s in self.requests.get(request_id, ()) if not s.is_finished]
        for seq in seqs:
            self._finish(Finish(seq, "abort"))
        return seqs

    def finish(self, finish: Finish) -> None:
        """Apply a finish decided outside a step: a resumed sample that had already finished (LLMEngine.add_request)."""
        self._finish(finish)

    def _finish(self, finish: Finish) -> None:
        seq = finish.seq
        if seq.is_finished:  # aborted in the same step: the abort stands
            return
        queue = self.running if seq.status is SequenceStatus.RUNNING else self.waiting
        queue.remove(seq)
        self.bm.free(seq)
        seq.drop_pending()
        seq.status = FINISH_STATUS[finish.reason]
        seq.finish_reason, seq.stop_reason = finish.reason, finish.stop_reason
        self._forget_if_done(seq.request_id)

    def _forget_if_done(self, request_id: str) -> None:
        if all(s.is_finished for s in self.requests[request_id]):
            del self.requests[request_id]
            self._unadmitted.discard(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ----------------------------------------------------------------------------------------
    def schedule(self, drafts: Mapping[int, Sequence_[int]] | None = None) -> SchedulerOutput:
        """The next step's chunks; `drafts[seq_id]`: tokens a drafter proposes to follow that decoding sequence's
        last one, verified in its decode chunk where the budget and free blocks leave room (`_attach_drafts`)."""
        if len(self._pending) >= self.max_inflight:
            raise RuntimeError(f"schedule() called with {len(self._pending)} step(s) not yet applied "
                               f"(max_inflight={self.max_inflight})")
        if drafts and self._pending:
            raise RuntimeError("drafts follow resolved tokens: schedule them with no step in flight")
        preempted: list[Sequence] = []
        plan = self.policy.plan(self, preempted)
        if drafts:
            self._attach_drafts(plan.scheduled, drafts)
        out = SchedulerOutput(plan.scheduled, preempted, plan.kind, plan.padding, len(self.running), len(self.waiting))
        self._pending.append(out)
        return out

    def _attach_drafts(self, scheduled: list[ScheduledSeq], drafts: Mapping[int, Sequence_[int]]) -> None:
        """Extend planned decode chunks by their sequence's drafts, in schedule order, with the budget the plan left
        and blocks already free: a draft never preempts or delays anyone. A sequence drafts at most up to the token
        that max_tokens or max_model_len would end it with, so every sampled row is one plain decoding samples."""
        budget = self.max_num_batched_tokens - sum(item.num_new_tokens for item in scheduled)
        for item in scheduled:
            seq = item.seq
            proposal = drafts.get(seq.seq_id)
            if budget <= 0 or not proposal or not (item.sample and item.num_new_tokens == 1):
                continue
            room = min(seq.params.max_tokens - seq.num_generated, self.max_model_len - seq.num_resolved) - 1
            k = min(len(proposal), budget, room, self.bm.room_tokens(seq))
            if k <= 0:
                continue
            self.bm.append_slots(seq, k)
            seq.num_computed_tokens += k
            seq.reserve_drafts(proposal[:k])
            item.num_new_tokens += k
            item.drafts = tuple(proposal[:k])
            budget -= k

    def grow(self, seq: Sequence, n: int, preempted: list[Sequence]) -> ScheduledSeq | None:
        """Schedule the next n tokens of running seq, preempting later arrivals for room; None if seq had to go."""
        if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this step
            return None
        if seq.num_pending and ends_by_length(seq, seq.num_tokens, self.max_model_len):
            return None  # its pending draw is its last: the length rule will finish it when read back
        if not self._make_room(seq, n, preempted):
            return None
        self.bm.append_slots(seq, n)
        return self._item(seq, n)

    def _make_room(self, seq: Sequence, n: int, preempted: list[Sequence]) -> bool:
        """Preempt the latest arrivals until seq can grow by n; False if seq itself had to go."""
        while not self.bm.can_append(seq, n):
            victim = self.running[-1]
            self._preempt(victim)
            preempted.append(victim)
            if victim is seq:
                return False
        return True

    def _preempt(self, seq: Sequence) -> None:
        # Recompute, not swap: generated tokens stay in token_ids and are recomputed like prompt tokens (often
        # straight from the prefix cache). Same tokens, same positions, so the same bits in deterministic mode.
        self.running.remove(seq)
        self.bm.free(seq)
        seq.num_computed_tokens = 0
        seq.num_preemptions += 1
        seq.status = SequenceStatus.WAITING
        bisect.insort(self.waiting, seq, key=lambda s: s.arrival)
        self.num_preemptions += 1

    def admit(self, budget: int, max_chunk: int | None = None,
              may_start: Callable[[Sequence, int, int], bool] | None = None) -> ScheduledSeq | None:
        """Admit the oldest waiting sequence whose request is under its cap and that `may_start(seq, tokens to
        compute, first chunk)` lets start (the policy's partial-prefill limits). FCFS otherwise: if it does not fit,
        nobody behind it jumps the queue."""
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return None
        found = self._next_admissible(budget, max_chunk or budget, may_start)
        if found is None:
            return None
        seq, n = found
        if not self.bm.can_allocate(seq, n):
            return None
        self.waiting.remove(seq)
        self.bm.allocate(seq, n)
        if seq.first_scheduled is None:
            seq.first_scheduled = time.monotonic()
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.arrival)
        self._unadmitted.discard(seq.request_id)
        return self._item(seq, n)

    def _next_admissible(self, budget: int, max_chunk: int,
                         may_start: Callable[[Sequence, int, int], bool] | None) -> tuple[Sequence, int] | None:
        """The oldest waiting sequence whose request holds fewer than per_request_cap running slots and that may
        start now, with its first chunk's size."""
        for seq in self.waiting:
            if self._num_running(seq.request_id) >= self.per_request_cap:
                continue
            if seq.num_pending:  # preempted before its draw was read back: its prefix hashes need that token
                return None
            remaining = seq.num_tokens - self.bm.num_cached_prefix_tokens(seq)
            n = min(remaining, budget, max_chunk)
            if may_start is None or may_start(seq, remaining, n):
                return seq, n
        return None

    def _num_running(self, request_id: str) -> int:
        return sum(s.status is SequenceStatus.RUNNING for s in self.requests[request_id])

    @staticmethod
    def _item(seq: Sequence, n: int) -> ScheduledSeq:
        start = seq.num_computed_tokens
        rows = seq.prompt_rows.take(start, start + n) if seq.prompt_rows is not None else _NO_ROWS
        item = ScheduledSeq(seq, n, start + n == seq.num_tokens, start, rows)
        seq.num_computed_tokens += n
        if item.sample:
            seq.reserve_token()
        return item

    # ---- results -------------------------------------------------------------------------------------------
    def apply(self, output: SchedulerOutput, finished: Iterable[Finish] = ()) -> None:
        """Apply the oldest scheduled step: its chunks' full blocks join the prefix cache, then the output processor's
        `finished` decisions end those sequences and free their blocks."""
        if not self._pending or output is not self._pending[0]:
            raise RuntimeError("apply() must receive the oldest output of schedule() not yet applied")
        self._pending.pop(0)
        for item in output.scheduled:
            if item.drafts and not item.seq.is_finished:  # first, so no rejected draft's KV is ever cached
                self._roll_back_drafts(item.seq)
        for item in output.scheduled:
            if not item.seq.is_finished:  # aborted mid-step: nothing to keep
                self.bm.cache_computed_blocks(item.seq)
        for finish in finished:
            self._finish(finish)

    def _roll_back_drafts(self, seq: Sequence) -> None:
        """After a verify chunk's read-back: the slots past the accepted drafts and their bonus token go, and so do
        the computed rows and blocks of the rejected drafts. The bonus token is left uncomputed, as a decode's draw."""
        seq.drop_pending()
        seq.num_computed_tokens = seq.num_tokens - 1
        self.bm.trim(seq)

    # ---- teacher-forced scoring ---------------------------------------------------------------------------
    @contextmanager
    def scoring_blocks(self, token_ids: list[int]) -> Iterator[Sequence]:
        """A sequence over token_ids holding KV blocks outside the queues (its cached prefix already computed),
        freed on exit. Only while nothing is in flight, so it never competes with a request for blocks."""
        if self.has_unfinished():
            raise RuntimeError("scoring runs only while no request is in flight")
        seq = Sequence(f"score-{id(token_ids)}", token_ids, SamplingParams(max_tokens=1))
        self.bm.allocate(seq)
        try:
            yield seq
        finally:
            self.bm.free(seq)

    def mark_computed(self, seq: Sequence, num_computed_tokens: int) -> None:
        """A scoring chunk ran up to num_computed_tokens: its full blocks join the prefix cache."""
        seq.num_computed_tokens = max(seq.num_computed_tokens, num_computed_tokens)
        self.bm.cache_computed_blocks(seq)

    def reset_prefix_cache(self) -> int:
        """Forget every cached prefix no sequence holds (after new weights, old KV is another model's); returns how
        many blocks were dropped."""
        return self.bm.reset_prefix_cache()

    # ---- observability -------------------------------------------------------------------------------------
    def stats(self) -> dict:
        s = self.bm.stats
        return {"num_running": len(self.running), "num_waiting": len(self.waiting),
                "num_preemptions": self.num_preemptions, "kv_usage": self.bm.usage, "prefix_queries": s.queries,
                "prefix_hits": s.hits}

    def check_integrity(self) -> None:
        self.bm.check_integrity()
        require(len(self.running) <= self.max_num_seqs, f"{len(self.running)} running > max_num_seqs")
        require(set(self.bm.seqs) == {s.seq_id for s in self.running}, "block holders != running sequences")
        for queue in (self.waiting, self.running):
            require([s.arrival for s in queue] == sorted(s.arrival for s in queue), "queue out of arrival order")
        require(not {id(s) for s in self.waiting} & {id(s) for s in self.running}, "sequence both waiting and running")
        live = {id(s) for seqs in self.requests.values() for s in seqs if not s.is_finished}
        require(live == {id(s) for s in self.waiting + self.running}, "request map out of sync with the queues")
        for seq in self.waiting:
            self._check_waiting(seq)
        for seq in self.running:
            self._check_running(seq)

    def _check_waiting(self, seq: Sequence) -> None:
        require(seq.status is SequenceStatus.WAITING, f"{seq!r} in waiting")
        require(not seq.block_table and seq.num_computed_tokens == 0, f"{seq!r} waits holding KV")
        require(seq.num_resolved < self.max_model_len, f"{seq!r} exceeds max_model_len")
        require(seq.num_pending <= self._slots_in_flight(seq), f"{seq!r}: more pending slots than draws in flight")

    def _slots_in_flight(self, seq: Sequence) -> int:
        """Token slots the steps not yet applied reserved for seq: one per draw, and one per draft it verifies."""
        return sum(1 + len(item.drafts) for out in self._pending for item in out.scheduled
                   if item.seq is seq and item.sample)

    def _check_running(self, seq: Sequence) -> None:
        bs, table = self.bm.block_size, len(seq.block_table)
        require(seq.status is SequenceStatus.RUNNING, f"{seq!r} in running")
        require(0 <= seq.num_computed_tokens < seq.num_tokens, f"{seq!r}: the last token must be uncomputed")
        require(seq.num_resolved < self.max_model_len, f"{seq!r} exceeds max_model_len")
        require(seq.num_generated < seq.params.max_tokens, f"{seq!r} should have finished")
        require(seq.num_pending <= self._slots_in_flight(seq), f"{seq!r}: more pending slots than draws in flight")
        require(table == cdiv(seq.num_computed_tokens, bs), f"{seq!r}: blocks do not match computed tokens")

