"""Continuous batching under a token budget: chunked prefill, FCFS, prefix caching, preemption by recompute.

Torch-free. One step = `schedule()` -> the runner computes and samples -> `update(output, sampled)`.
Every decision here changes only *which* tokens run together, never what a token computes: in deterministic mode the
kernels make each row's bits independent of its neighbours, and the sampler keys on (seed, sample index, position).

Policies:
- "dynamic": vLLM-v1 style unified step. Running sequences first (oldest first), one chunk each: a decode is 1 token,
  a prefill (or a recompute after preemption) takes what the budget leaves; then waiting sequences are admitted FCFS.
  Decodes come before prefills without a separate pass: a newcomer is only admitted with budget to spare, so every
  running prefill is younger than every running decode (the soak test checks this).
- "bucketed": the fixed-shape serving of the seed's sections 6.1-6.2, without invariant kernels. A step is either
  a *prefill* step of ONE sequence whose chunk is padded up to a length bucket (16, 32, 64, ... <= budget), or a
  *decode* step of 1 token per sequence whose row count is padded up to a batch bucket (8, 16, 32, ..., max_num_seqs).
  Steps alternate when both kinds are ready. Short batches are padded, never held back: waiting would add latency
  without narrowing the shapes any further.
"""
from __future__ import annotations

import bisect
from collections.abc import Mapping
from dataclasses import dataclass, field

from samebits.engine.block_manager import BlockManager, IntegrityError, cdiv
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.sequence import FINISH_STATUS, Sequence, SequenceStatus, make_sequences

POLICIES = ("dynamic", "bucketed")


class SchedulerFull(RuntimeError):
    """More requests are queued than max_waiting allows; the server answers 429/503."""


@dataclass
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int
    # True when this chunk ends at the sequence's last token, so its last row's logits give the next token.
    sample: bool
    # seq.num_computed_tokens at schedule time: new token i sits at position start + i.
    start: int
    # Rows the runner must run for this sequence (>= num_new_tokens). Only bucketed prefill pads; the extra rows are
    # dummies after the real tokens, so causal attention keeps them out of every real row.
    pad_to: int

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start:self.start + self.num_new_tokens]

    @property
    def context_len(self) -> int:
        return self.start + self.num_new_tokens

    @property
    def is_decode(self) -> bool:
        return self.num_new_tokens == 1 and self.sample


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    kind: str = "empty"  # "empty" | "prefill" | "decode" | "mixed"
    # Rows (sequences) the runner must run: len(scheduled) plus padding rows, each a 1-token dummy (bucketed decode).
    batch_pad_to: int = 0
    num_running: int = 0
    num_waiting: int = 0

    @property
    def is_empty(self) -> bool:
        return not self.scheduled

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def num_padded_tokens(self) -> int:
        """Total rows of the step's flattened token batch, padding included."""
        return sum(s.pad_to for s in self.scheduled) + self.num_pad_rows

    @property
    def num_pad_rows(self) -> int:
        return self.batch_pad_to - len(self.scheduled)

    @property
    def num_decode_seqs(self) -> int:
        return sum(s.is_decode for s in self.scheduled)


def _step_kind(scheduled: list[ScheduledSeq]) -> str:
    decodes = sum(s.is_decode for s in scheduled)
    if not scheduled:
        return "empty"
    return "decode" if decodes == len(scheduled) else "prefill" if decodes == 0 else "mixed"


def default_length_buckets(budget: int) -> tuple[int, ...]:
    buckets, b = [], 16
    while b <= budget:
        buckets.append(b)
        b *= 2
    return tuple(buckets) or (budget,)


def default_batch_buckets(max_num_seqs: int) -> tuple[int, ...]:
    buckets, b = [], 8
    while b < max_num_seqs:
        buckets.append(b)
        b *= 2
    return tuple(buckets) + (max_num_seqs,)


def bucket_for(n: int, buckets: tuple[int, ...]) -> int:
    return buckets[bisect.bisect_left(buckets, n)]


class Scheduler:
    def __init__(self, block_manager: BlockManager, *, max_model_len: int, max_num_seqs: int = 256,
                 max_num_batched_tokens: int = 2048, policy: str = "dynamic", eos_token_ids=(),
                 max_waiting: int | None = None, length_buckets: tuple[int, ...] | None = None,
                 batch_buckets: tuple[int, ...] | None = None):
        self.bm = block_manager
        self.max_model_len = max_model_len
        self.max_num_seqs = max_num_seqs
        self.max_num_batched_tokens = max_num_batched_tokens
        self.policy = policy
        self.eos_token_ids = frozenset(eos_token_ids)
        self.max_waiting = max_waiting
        self.length_buckets = tuple(length_buckets or default_length_buckets(max_num_batched_tokens))
        self.batch_buckets = tuple(batch_buckets or default_batch_buckets(max_num_seqs))
        self._validate()
        self.waiting: list[Sequence] = []  # sorted by arrival, preempted ones included
        self.running: list[Sequence] = []  # sorted by arrival: the last one is the preemption victim
        self.requests: dict[str, list[Sequence]] = {}
        self._unadmitted: set[str] = set()  # requests none of whose samples has run yet (max_waiting counts these)
        self._arrivals = 0
        self._pending: SchedulerOutput | None = None
        self._last_kind = "empty"
        self.num_preemptions = 0
        self.num_steps = 0

    @classmethod
    def from_config(cls, config, num_blocks: int, max_model_len: int, eos_token_ids=()) -> Scheduler:
        bm = BlockManager(num_blocks, config.block_size, config.enable_prefix_caching)
        return cls(bm, max_model_len=max_model_len, max_num_seqs=config.max_num_seqs,
                   max_num_batched_tokens=config.max_num_batched_tokens, policy=config.policy,
                   eos_token_ids=eos_token_ids, max_waiting=config.max_waiting)

    def _validate(self) -> None:
        if self.policy not in POLICIES:
            raise ValueError(f"policy must be one of {POLICIES}, got {self.policy!r}")
        if self.max_model_len < 2:
            raise ValueError(f"max_model_len must be >= 2, got {self.max_model_len}")
        if self.bm.capacity_tokens < self.max_model_len:
            # Otherwise a lone sequence could outgrow the pool and preempt itself forever.
            raise ValueError(f"the KV cache holds {self.bm.capacity_tokens} tokens; it must hold at least "
                             f"max_model_len={self.max_model_len}")
        if self.policy == "bucketed":
            self._validate_buckets()

    def _validate_buckets(self) -> None:
        lb, bb = self.length_buckets, self.batch_buckets
        if list(lb) != sorted(set(lb)) or lb[-1] > self.max_num_batched_tokens:
            raise ValueError(f"length buckets must increase and stay <= max_num_batched_tokens, got {lb}")
        if list(bb) != sorted(set(bb)) or bb[-1] < self.max_num_seqs:
            raise ValueError(f"batch buckets must increase and reach max_num_seqs={self.max_num_seqs}, got {bb}")
        if bb[-1] > self.max_num_batched_tokens:
            raise ValueError(f"max_num_batched_tokens must be >= the largest batch bucket {bb[-1]} under "
                             f"policy='bucketed', got {self.max_num_batched_tokens}")

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
            raise SchedulerFull(f"{len(self._unadmitted)} requests are waiting; max_waiting is {self.max_waiting}")

    def abort(self, request_id: str) -> list[Sequence]:
        """Finish every sample of the request and free its KV blocks now. Unknown ids are ignored (idempotent).
        Not thread-safe: call between steps; an abort between schedule() and update() is allowed."""
        seqs = [s for s in self.requests.get(request_id, ()) if not s.is_finished]
        for seq in seqs:
            self.finish(seq, "abort")
        return seqs

    def finish(self, seq: Sequence, reason: str, stop_reason: str | int | None = None) -> None:
        """End a sequence ("stop" | "length" | "abort"); the detokenizer calls this for stop strings."""
        if seq.is_finished:
            self._restate(seq, reason, stop_reason)
            return
        queue = self.running if seq.status is SequenceStatus.RUNNING else self.waiting
        queue.remove(seq)
        self.bm.free(seq)
        seq.status = FINISH_STATUS[reason]
        seq.finish_reason, seq.stop_reason = reason, stop_reason
        self._forget_if_done(seq.request_id)

    @staticmethod
    def _restate(seq: Sequence, reason: str, stop_reason: str | int | None) -> None:
        # The token that hit max_tokens may also complete a stop string; like vLLM, report the stop.
        if seq.finish_reason == "length" and reason == "stop":
            seq.status = FINISH_STATUS[reason]
            seq.finish_reason, seq.stop_reason = reason, stop_reason

    def _forget_if_done(self, request_id: str) -> None:
        if all(s.is_finished for s in self.requests[request_id]):
            del self.requests[request_id]
            self._unadmitted.discard(request_id)

    def has_unfinished(self) -> bool:
        return bool(self.waiting or self.running)

    # ---- scheduling ----------------------------------------------------------------------------------------
    def schedule(self) -> SchedulerOutput:
        if self._pending is not None:
            raise RuntimeError("schedule() called twice without update()")
        preempted: list[Sequence] = []
        if self.policy == "dynamic":
            scheduled = self._schedule_dynamic(preempted)
            kind, pad_rows = _step_kind(scheduled), 0
        else:
            scheduled, kind, pad_rows = self._schedule_bucketed(preempted)
        out = SchedulerOutput(scheduled, preempted, kind, len(scheduled) + pad_rows, len(self.running),
                              len(self.waiting))
        self._last_kind = out.kind
        self._pending = out
        self.num_steps += 1
        return out

    def _schedule_dynamic(self, preempted: list[Sequence]) -> list[ScheduledSeq]:
        budget, scheduled = self.max_num_batched_tokens, []
        for seq in list(self.running):
            if budget == 0:
                break
            item = self._schedule_running(seq, min(seq.num_uncomputed, budget), preempted)
            if item is not None:
                scheduled.append(item)
                budget -= item.num_new_tokens
        # vLLM's rule: a step that had to preempt admits nobody, or the victim's blocks go straight to a newcomer.
        while not preempted and budget > 0:
            item = self._admit(budget)
            if item is None:
                break
            scheduled.append(item)
            budget -= item.num_new_tokens
        return scheduled

    def _schedule_running(self, seq: Sequence, n: int, preempted: list[Sequence]) -> ScheduledSeq | None:
        if seq.status is not SequenceStatus.RUNNING:  # preempted earlier in this step
            return None
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

    def _admit(self, budget: int, max_chunk: int | None = None) -> ScheduledSeq | None:
        """Admit the head of the waiting queue (FCFS: if it does not fit, nobody behind it jumps the queue)."""
        if not self.waiting or len(self.running) >= self.max_num_seqs:
            return None
        seq = self.waiting[0]
        n = min(seq.num_tokens - self.bm.num_cached_prefix_tokens(seq), budget, max_chunk or budget)
        if not self.bm.can_allocate(seq, n):
            return None
        self.waiting.pop(0)
        self.bm.allocate(seq, n)
        seq.status = SequenceStatus.RUNNING
        bisect.insort(self.running, seq, key=lambda s: s.arrival)
        self._unadmitted.discard(seq.request_id)
        return self._item(seq, n)

    def _item(self, seq: Sequence, n: int, pad_to: int | None = None) -> ScheduledSeq:
        start = seq.num_computed_tokens
        return ScheduledSeq(seq, n, start + n == seq.num_tokens, start, pad_to or n)

    # ---- bucketed policy -----------------------------------------------------------------------------------
    def _schedule_bucketed(self, preempted: list[Sequence]) -> tuple[list[ScheduledSeq], str, int]:
        """(scheduled, kind, padding rows). The kind is the step's shape family, so a 1-token prompt admitted in a
        prefill step is still a padded prefill."""
        has_decode = any(s.num_uncomputed == 1 for s in self.running)
        decode_first = has_decode and self._last_kind == "prefill"  # alternate so neither kind starves
        for kind in (("decode", "prefill") if decode_first else ("prefill", "decode")):
            if kind == "prefill":
                item = self._bucketed_prefill(preempted)
                if item is not None:
                    return [item], kind, 0
            else:
                scheduled = self._bucketed_decode(preempted)
                if scheduled:
                    return scheduled, kind, bucket_for(len(scheduled), self.batch_buckets) - len(scheduled)
        return [], "empty", 0

    def _bucketed_prefill(self, preempted: list[Sequence]) -> ScheduledSeq | None:
        longest = self.length_buckets[-1]
        seq = next((s for s in self.running if s.in_prefill), None)
        if seq is not None:
            item = self._schedule_running(seq, min(seq.num_uncomputed, longest), preempted)
        else:
            item = None if preempted else self._admit(longest, longest)
        if item is not None:
            item.pad_to = bucket_for(item.num_new_tokens, self.length_buckets)
        return item

    def _bucketed_decode(self, preempted: list[Sequence]) -> list[ScheduledSeq]:
        scheduled = []
        for seq in list(self.running):
            if len(scheduled) == self.batch_buckets[-1]:
                break
            if seq.status is SequenceStatus.RUNNING and seq.num_uncomputed == 1:
                item = self._schedule_running(seq, 1, preempted)
                scheduled += [item] if item is not None else []
        return scheduled

    # ---- results -------------------------------------------------------------------------------------------
    def update(self, output: SchedulerOutput, sampled: Mapping[int, int | None]) -> list[Sequence]:
        """Advance every scheduled sequence; `sampled[seq_id]` is the token drawn for each item with sample=True.
        Returns the sequences that finished in this step (stop token, eos, max_tokens or max_model_len)."""
        if output is not self._pending:
            raise RuntimeError("update() must receive the output of the last schedule()")
        self._pending = None
        finished = []
        for item in output.scheduled:
            if not item.seq.is_finished and self._advance(item, sampled):  # aborted mid-step: nothing to keep
                finished.append(item.seq)
        return finished

    def _advance(self, item: ScheduledSeq, sampled: Mapping[int, int | None]) -> bool:
        seq = item.seq
        seq.num_computed_tokens += item.num_new_tokens
        self.bm.cache_computed_blocks(seq)
        if not item.sample:
            return False
        token = sampled.get(seq.seq_id)
        if token is None:
            raise ValueError(f"no sampled token for {seq!r}, whose chunk ended with sample=True")
        seq.append_token(token)
        return self._check_stop(seq)

    def _check_stop(self, seq: Sequence) -> bool:
        token, params = seq.last_token_id, seq.params
        if token in self.eos_token_ids and not params.ignore_eos:
            self.finish(seq, "stop")
        elif token in params.stop_token_set:
            self.finish(seq, "stop", token)
        elif seq.num_generated >= params.max_tokens or seq.num_tokens >= self.max_model_len:
            self.finish(seq, "length")
        return seq.is_finished

    # ---- observability -------------------------------------------------------------------------------------
    def stats(self) -> dict:
        s = self.bm.stats
        return {"num_running": len(self.running), "num_waiting": len(self.waiting), "num_steps": self.num_steps,
                "num_preemptions": self.num_preemptions, "kv_usage": self.bm.usage, "prefix_queries": s.queries,
                "prefix_hits": s.hits, "prefix_hit_rate": s.hit_rate, "prefix_evictions": s.evictions}

    def check_integrity(self) -> None:
        self.bm.check_integrity()
        _check(len(self.running) <= self.max_num_seqs, f"{len(self.running)} running > max_num_seqs")
        _check(set(self.bm.seqs) == {s.seq_id for s in self.running}, "block holders != running sequences")
        for queue in (self.waiting, self.running):
            _check([s.arrival for s in queue] == sorted(s.arrival for s in queue), "queue out of arrival order")
        _check(not {id(s) for s in self.waiting} & {id(s) for s in self.running}, "sequence both waiting and running")
        live = {id(s) for seqs in self.requests.values() for s in seqs if not s.is_finished}
        _check(live == {id(s) for s in self.waiting + self.running}, "request map out of sync with the queues")
        for seq in self.waiting:
            self._check_waiting(seq)
        for seq in self.running:
            self._check_running(seq)

    def _check_waiting(self, seq: Sequence) -> None:
        _check(seq.status is SequenceStatus.WAITING, f"{seq!r} in waiting")
        _check(not seq.block_table and seq.num_computed_tokens == 0, f"{seq!r} waits holding KV")
        _check(seq.num_tokens < self.max_model_len, f"{seq!r} exceeds max_model_len")

    def _check_running(self, seq: Sequence) -> None:
        bs, table = self.bm.block_size, len(seq.block_table)
        _check(seq.status is SequenceStatus.RUNNING, f"{seq!r} in running")
        _check(0 <= seq.num_computed_tokens < seq.num_tokens, f"{seq!r}: the last token must be uncomputed")
        _check(seq.num_tokens < self.max_model_len, f"{seq!r} exceeds max_model_len")
        _check(seq.num_generated < seq.params.max_tokens, f"{seq!r} should have finished")
        if self._pending is None:
            _check(table == cdiv(seq.num_computed_tokens, bs), f"{seq!r}: blocks do not match computed tokens")
        else:
            _check(cdiv(seq.num_computed_tokens, bs) <= table <= cdiv(seq.num_tokens, bs), f"{seq!r}: blocks")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise IntegrityError(message)
