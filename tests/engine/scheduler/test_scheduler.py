import hashlib
import itertools
import random
import subprocess
import sys

import pytest

from samebits.arith import kv_slot
from samebits.engine.config import POLICIES, EngineConfig
from samebits.engine.output_processor import OutputProcessor
from samebits.engine.outputs import StepResult
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.scheduler import BlockManager, QueueFull, Scheduler, SchedulerOutput
from samebits.engine.scheduler.bucketed import BucketedPolicy
from samebits.engine.scheduler.policies import DynamicPolicy
from samebits.engine.scheduler.prefills import PrefillLimits
from samebits.engine.sequence import PENDING, Finish, SequenceStatus

EOS = 0
VOCAB = 40


class LetterTokenizer:
    """Token t decodes to one letter, so stop strings are letters."""

    @staticmethod
    def decode(ids, skip_special_tokens=True):
        return "".join(chr(ord("A") + t) for t in ids)


def make(num_blocks=64, block_size=4, max_model_len=64, caching=True, **kw):
    """kw: Scheduler options; max_inflight=2 schedules one step ahead (drive() then overlaps like the engine)."""
    bm = BlockManager(num_blocks, block_size, caching)
    sched = Scheduler(bm, max_model_len=max_model_len, **kw)
    sched.test_processor = OutputProcessor(LetterTokenizer(), {EOS}, max_model_len)
    return sched


def finish_step(sched, out, sampled, extra=()):
    """The engine's step after the runner: the output processor decides, the scheduler applies."""
    finished = sched.test_processor.process(out, sampled)
    sched.apply(out, [*finished, *extra])
    return finished


def draw(seq, context):
    """A fake model + sampler: the next token is a function of the request and the KV it reads, nothing else."""
    key = repr((seq.seed, seq.sample_index, context)).encode()
    return int.from_bytes(hashlib.blake2b(key, digest_size=8).digest(), "little") % VOCAB


class FakeRunner:
    """Writes (token, position) into KV slots and checks every chunk reads exactly its own history. A chunk's last
    token may still be pending: like ModelRunner.execute, it takes it from the previous step's draws."""

    def __init__(self, sched):
        self.sched, self.bm, self.kv = sched, sched.bm, {}

    def slot(self, seq, pos):
        return kv_slot(seq.block_table, pos, self.bm.block_size)

    def run(self, out, previous=None):
        sampled = {}
        for item in out.scheduled:
            seq = item.seq
            assert seq.num_computed_tokens == item.context_len and item.num_new_tokens >= 1, "counted when scheduled"
            history = self.history(item, previous or {})
            for i, tok in enumerate(history[item.start:]):
                block = self.bm.blocks[seq.block_table[(item.start + i) // self.bm.block_size]]
                assert block.ref_count == 1 and block.hash is None, "writing into a shared or cached block"
                self.kv[self.slot(seq, item.start + i)] = (tok, item.start + i)
            context = [self.kv[self.slot(seq, p)] for p in range(item.context_len)]
            assert context == list(zip(history, range(item.context_len)))
            if item.sample:
                sampled[seq.seq_id] = StepResult(draw(seq, tuple(context)), 0.0, {})
        return sampled

    @staticmethod
    def history(item, previous):
        tokens = item.seq.token_ids[:item.context_len]
        assert PENDING not in tokens[:-1], "only a chunk's last token can be pending"
        if tokens[-1] == PENDING:
            tokens[-1] = previous[item.seq.seq_id].token_id
        return tokens


def drive(sched, max_steps=5000, on_step=None, runner=None):
    """The engine's step loop; with sched.max_inflight == 2, step N+1 is scheduled and run before N is applied."""
    # One runner per scheduler: its fake KV must outlive a drive() so later prefix hits read real entries.
    runner = runner or sched.__dict__.setdefault("_fake_runner", FakeRunner(sched))
    inflight = None
    for step in range(max_steps):
        if not sched.has_unfinished() and inflight is None:
            return step
        launched = None
        if sched.has_unfinished():
            out = sched.schedule()
            sched.check_integrity()
            check_shape(sched, out)
            if on_step:
                on_step(step, out)
            launched = (out, runner.run(out, inflight[1] if inflight else None))
            if sched.max_inflight == 1:
                inflight, launched = launched, None
        if inflight is not None:
            finish_step(sched, *inflight)
        inflight = launched
        sched.check_integrity()
    raise AssertionError("did not finish")


def check_shape(sched, out):
    assert out.num_padded_tokens <= sched.max_num_batched_tokens
    assert len(out.scheduled) <= sched.max_num_seqs and all(k >= 1 for k in out.padding)
    assert len({id(s.seq) for s in out.scheduled}) == len(out.scheduled)
    for item in out.scheduled:
        # A chunk that samples holds the slot of its draw; the scheduler reserved it as the sequence's last.
        assert item.sample == (item.context_len + 1 == item.seq.num_tokens and item.seq.token_ids[-1] == PENDING)


def add(sched, rid, prompt, **params):
    seed = int.from_bytes(hashlib.blake2b(rid.encode(), digest_size=4).digest(), "little")
    seqs = sched.add_request(rid, prompt, SamplingParams(**params), seed=seed)
    sched.test_processor.add_request(rid, None, prompt, seed, seqs)
    return seqs


def results(sched_requests):
    return {(s.request_id, s.sample_index): (tuple(s.output_token_ids), s.finish_reason) for s in sched_requests}


def test_chunked_prefill_spans_steps_and_samples_once():
    sched = make(max_num_batched_tokens=16, max_model_len=128)
    (seq,) = add(sched, "long", list(range(1, 41)), max_tokens=2, ignore_eos=True)
    chunks = []
    drive(sched, on_step=lambda i, out: chunks.append([(x.start, x.num_new_tokens, x.sample) for x in out.scheduled]))
    assert chunks == [[(0, 16, False)], [(16, 16, False)], [(32, 8, True)], [(40, 1, True)]]
    assert seq.finish_reason == "length" and seq.num_generated == 2


@pytest.mark.parametrize("threshold", [None, 0])
def test_budget_decodes_first_then_fcfs_prefills(threshold):
    """A long prefill among others takes at most the long-prefill cap (None: half the budget), so the short prompt
    behind it starts in the same step; with the cap off (0, the old policy) it takes all the decode leaves."""
    sched = make(max_num_batched_tokens=10, prefill=PrefillLimits(threshold))
    add(sched, "a", [1, 2, 3], max_tokens=5, ignore_eos=True)
    finish_step(sched, out := sched.schedule(), FakeRunner(sched).run(out))
    add(sched, "b", list(range(1, 21)), max_tokens=1)
    add(sched, "c", [5, 6], max_tokens=1)
    out = sched.schedule()
    chunks = [(x.seq.request_id, x.num_new_tokens) for x in out.scheduled]
    assert chunks == ([("a", 1), ("b", 5), ("c", 2)] if threshold is None else [("a", 1), ("b", 9)])
    assert out.kind == "mixed" and out.num_batched_tokens == (8 if threshold is None else 10)


def test_max_num_seqs_caps_running():
    sched = make(max_num_seqs=2)
    for i in range(5):
        add(sched, f"r{i}", [1, 2, 3], max_tokens=3, ignore_eos=True)
    drive(sched, on_step=lambda i, out: (len(sched.running) <= 2) or pytest.fail("too many running"))


def test_prefix_cache_hit_reported_and_skipped():
    sched = make(block_size=4, max_model_len=128)
    shared = list(range(1, 13))
    add(sched, "cold", shared + [20, 21], max_tokens=1)
    drive(sched)
    (hot,) = add(sched, "hot", shared + [30], max_tokens=1)
    out = sched.schedule()
    assert hot.num_cached_tokens == 12 and out.scheduled[0].start == 12 and out.scheduled[0].num_new_tokens == 1
    assert sched.stats()["prefix_hits"] == 12


def test_n_samples_get_distinct_keys_and_share_prefix():
    sched = make(max_model_len=128)
    seqs = add(sched, "r", list(range(1, 30)), n=4, max_tokens=8, ignore_eos=True)
    drive(sched)
    assert [s.sample_index for s in seqs] == [0, 1, 2, 3]
    assert len({tuple(s.output_token_ids) for s in seqs}) == 4
    assert "r" not in sched.requests


def test_stop_conditions():
    sched = make()
    # Find what the fake model emits first, then stop on it in different ways.
    (probe,) = add(sched, "probe", [7, 8, 9], max_tokens=1)
    drive(sched)
    first = probe.output_token_ids[0]
    (by_id,) = add(sched, "probe", [7, 8, 9], max_tokens=5, stop_token_ids=[first])
    drive(sched)
    assert by_id.finish_reason == "stop" and by_id.stop_reason == first and by_id.output_token_ids == [first]
    (by_len,) = add(sched, "len", [7, 8, 9], max_tokens=3, ignore_eos=True)
    (by_ctx,) = add(sched, "ctx", list(range(1, 60)), max_tokens=100, ignore_eos=True)
    drive(sched)
    assert by_len.finish_reason == "length" and by_len.num_generated == 3
    assert by_ctx.finish_reason == "length" and by_ctx.num_tokens == 64


def test_eos_stops_unless_ignored():
    sched = make()
    sched.test_processor.eos_token_ids = frozenset(range(VOCAB))  # every token is eos
    (stops,) = add(sched, "a", [1, 2], max_tokens=5)
    (ignores,) = add(sched, "b", [1, 2], max_tokens=5, ignore_eos=True)
    drive(sched)
    assert stops.num_generated == 1 and stops.finish_reason == "stop" and stops.stop_reason is None
    assert ignores.num_generated == 5 and ignores.finish_reason == "length"


def test_stop_strings_finish_through_the_processor_and_free_blocks():
    sched = make()
    (probe,) = add(sched, "probe", [1, 2, 3], max_tokens=3, ignore_eos=True)
    drive(sched)
    text = LetterTokenizer.decode(probe.output_token_ids)
    (seq,) = add(sched, "probe", [1, 2, 3], max_tokens=10, ignore_eos=True, stop=[text[1:3]])
    drive(sched)
    assert (seq.finish_reason, seq.stop_reason, seq.status) == ("stop", text[1:3], SequenceStatus.FINISHED_STOPPED)
    assert seq.output_token_ids == probe.output_token_ids and not seq.block_table, "the same request, cut at the stop"
    assert sched.bm.num_free_blocks == sched.bm.num_blocks and not sched.has_unfinished()
    sched.check_integrity()


def test_apply_frees_the_processors_decisions_once():
    sched = make()
    (seq,) = add(sched, "a", [1, 2, 3, 4, 5], max_tokens=10, ignore_eos=True)
    out = sched.schedule()
    sched.apply(out, [Finish(seq, "stop", "###"), Finish(seq, "abort")])
    assert (seq.finish_reason, seq.stop_reason, seq.status) == ("stop", "###", SequenceStatus.FINISHED_STOPPED)
    assert not seq.block_table and sched.bm.num_free_blocks == sched.bm.num_blocks and not sched.has_unfinished()
    assert sched.abort("a") == [] and seq.finish_reason == "stop", "a finished sequence is never re-finished"
    sched.check_integrity()


def test_abort_frees_blocks_at_once_even_mid_step():
    sched = make()
    (a,) = add(sched, "a", list(range(1, 20)), max_tokens=10)
    (b,) = add(sched, "b", list(range(1, 9)), max_tokens=10, ignore_eos=True)
    out = sched.schedule()
    assert sched.abort("a") == [a] and a.finish_reason == "abort" and not a.block_table
    sched.check_integrity()
    finish_step(sched, out, run_live(FakeRunner(sched), out))
    assert a.num_generated == 0 and b.num_generated == 1
    assert sched.abort("a") == [] and sched.abort("nope") == []
    sched.abort("b")
    assert sched.bm.num_free_blocks == sched.bm.num_blocks
    sched.check_integrity()


def test_abort_waiting_request():
    sched = make(max_num_seqs=1)
    add(sched, "a", [1, 2], max_tokens=3)
    add(sched, "b", [1, 2], n=2, max_tokens=3)
    sched.schedule()
    assert len(sched.abort("b")) == 2 and len(sched.waiting) == 0
    sched.check_integrity()


def test_preemption_by_recompute_and_recovery():
    prompts = {f"r{i}": [1 + i % 3] * (6 + 3 * i) for i in range(6)}

    def run(num_blocks):
        sched = make(num_blocks=num_blocks, block_size=4, max_model_len=48)
        seqs = [s for rid, p in prompts.items() for s in add(sched, rid, p, max_tokens=20, ignore_eos=True)]
        victims = []
        drive(sched, on_step=lambda i, out: victims.extend(out.preempted))
        return results(seqs), sched, victims

    ample, _, none = run(200)
    tight, sched, victims = run(12)
    assert not none and sched.num_preemptions > 0 and tight == ample
    assert any(v.num_preemptions for v in victims)


def test_preemption_victim_is_latest_arrival_and_goes_to_front():
    sched = make(num_blocks=4, block_size=4, max_model_len=16)
    (_a,) = add(sched, "a", [1] * 4, max_tokens=10, ignore_eos=True)
    (b,) = add(sched, "b", [2] * 4, max_tokens=10, ignore_eos=True)
    (_c,) = add(sched, "c", [3] * 9, max_tokens=10, ignore_eos=True)
    runner = FakeRunner(sched)
    preempted = []
    while not preempted:
        out = sched.schedule()
        preempted = out.preempted
        finish_step(sched, out, runner.run(out))
        sched.check_integrity()
    assert preempted[0] is b and sched.waiting[0] is b and b.num_computed_tokens == 0
    assert b.num_generated > 0, "generated tokens are kept and recomputed"


def outcome_requests():
    rng = random.Random(7)
    shared = [rng.randrange(1, VOCAB) for _ in range(24)]
    reqs = []
    for i in range(24):
        prompt = shared[: rng.randrange(0, 24)] + [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 30))]
        reqs.append((f"r{i}", prompt, {"max_tokens": rng.randrange(1, 20), "n": rng.choice([1, 1, 2])}))
    return reqs


def outcome(cfg, runner_type=None):
    """The requests' tokens and finish reasons under scheduler options `cfg`, and the preemption count."""
    sched = make(block_size=4, max_model_len=96, **cfg)
    seqs = [s for rid, p, kw in outcome_requests() for s in add(sched, rid, p, **kw)]
    drive(sched, runner=runner_type(sched) if runner_type else None)
    return results(seqs), sched.num_preemptions


def test_outputs_are_a_function_of_the_request_alone():
    """Budget, pool size, seq cap, prefix caching, policy, prefill fairness and scheduling one step ahead change who
    runs together, never the tokens."""
    configs = [
        {"num_blocks": 400, "max_num_batched_tokens": 2048},
        {"num_blocks": 400, "max_num_batched_tokens": 7},
        {"num_blocks": 24, "max_num_batched_tokens": 64},
        {"num_blocks": 400, "max_num_seqs": 1},
        {"num_blocks": 400, "caching": False},
        {"num_blocks": 30, "policy": "bucketed", "max_num_seqs": 16, "max_num_batched_tokens": 64},
        {"num_blocks": 400, "max_inflight": 2},
        {"num_blocks": 400, "max_num_batched_tokens": 32, "prefill": PrefillLimits(0)},
        {"num_blocks": 400, "max_num_batched_tokens": 32, "prefill": PrefillLimits(3, 2, 1), "max_inflight": 2},
        {"num_blocks": 24, "max_num_batched_tokens": 64, "max_inflight": 2},
        {"num_blocks": 30, "policy": "bucketed", "max_num_seqs": 16, "max_num_batched_tokens": 64, "max_inflight": 2},
    ]
    outcomes, preemptions = zip(*(outcome(cfg) for cfg in configs))
    assert all(o == outcomes[0] for o in outcomes[1:])
    assert preemptions[0] == 0 and all(preemptions[i] > 0 for i in (2, 5, 9, 10)), preemptions


class BatchCoupledRunner(FakeRunner):
    """A model whose draw also sees how many chunks share the step: what a batch-variant kernel does."""

    def run(self, out, previous=None):
        sampled = super().run(out, previous)
        return {k: StepResult((r.token_id + len(out.scheduled)) % VOCAB, 0.0, {}) for k, r in sampled.items()}


def test_negative_control_a_batch_coupled_model_is_caught():
    ample, _ = outcome({"num_blocks": 400}, BatchCoupledRunner)
    tight, _ = outcome({"num_blocks": 24, "max_num_batched_tokens": 64, "max_inflight": 2}, BatchCoupledRunner)
    assert ample != tight


def test_bucketed_shapes():
    sched = make(num_blocks=200, max_model_len=128, policy="bucketed", max_num_seqs=32, max_num_batched_tokens=64)
    assert sched.policy.length_buckets == (16, 32, 64) and sched.policy.batch_buckets == (8, 16, 32)
    for i in range(11):
        add(sched, f"r{i}", [1 + i] * (1 + 9 * i), max_tokens=4, ignore_eos=True)  # r0: a 1-token prompt
    kinds = []

    def check(step, out):
        kinds.append(out.kind)
        if out.kind == "prefill":
            assert len(out.scheduled) == 1 and len(out.padding) <= 1
            assert out.num_padded_tokens in sched.policy.length_buckets
        else:
            assert out.kind == "decode" and len(out.scheduled) + len(out.padding) in sched.policy.batch_buckets
            assert all(x.num_new_tokens == 1 for x in out.scheduled) and set(out.padding) <= {1}
    drive(sched, on_step=check)
    assert "decode" in kinds and "prefill" in kinds and "mixed" not in kinds
    assert any(a == "prefill" and b == "decode" for a, b in itertools.pairwise(kinds)), "kinds alternate"


def test_validation_errors():
    sched = make(max_model_len=16, max_waiting=2)
    with pytest.raises(ValueError, match="max_model_len - 1 = 15"):
        add(sched, "x", [1] * 16)
    add(sched, "a", [1])
    with pytest.raises(ValueError, match="already in flight"):
        add(sched, "a", [1])
    add(sched, "b", [1])
    assert not sched.can_add_request()
    with pytest.raises(QueueFull, match=r"full \(2 requests\)"):
        add(sched, "c", [1])
    with pytest.raises(ValueError, match="at least max_model_len=64"):
        make(num_blocks=4, block_size=4, max_model_len=64)
    with pytest.raises(ValueError, match="max_num_batched_tokens must be >= the largest batch bucket"):
        make(policy="bucketed", max_num_seqs=32, max_num_batched_tokens=16)


def test_step_protocol_errors():
    sched = make()
    (s,) = add(sched, "a", [1, 2], max_tokens=2)
    out = sched.schedule()
    with pytest.raises(RuntimeError, match=r"1 step\(s\) not yet applied \(max_inflight=1\)"):
        sched.schedule()
    with pytest.raises(ValueError, match="no sampled token"):
        sched.test_processor.process(out, {})
    with pytest.raises(RuntimeError, match="oldest output"):
        sched.apply(SchedulerOutput())
    sched.apply(out)
    with pytest.raises(RuntimeError, match="oldest output"):
        sched.apply(out)
    assert s.num_computed_tokens == 2


def test_one_step_ahead_applies_in_order():
    sched = make(max_inflight=2)
    (s,) = add(sched, "a", [1, 2], max_tokens=5, ignore_eos=True)
    first, second = sched.schedule(), sched.schedule()
    assert (s.num_pending, s.num_computed_tokens, s.token_ids) == (2, 3, [1, 2, PENDING, PENDING])
    assert second.scheduled[0].start == 2, "the ahead step computes the pending token's position"
    with pytest.raises(RuntimeError, match="2 step"):
        sched.schedule()
    with pytest.raises(RuntimeError, match="oldest output"):
        sched.apply(second)
    finish_step(sched, first, {s.seq_id: StepResult(7, 0.0, {})})
    assert (s.num_pending, s.output_token_ids) == (1, [7])
    sched.check_integrity()
    with pytest.raises(ValueError, match="max_inflight must be 1 or 2"):
        make(max_inflight=3)


def test_a_pending_last_draw_is_not_scheduled_again():
    sched = make(max_inflight=2)
    (s,) = add(sched, "a", [1, 2], max_tokens=1, ignore_eos=True)
    first = sched.schedule()
    assert sched.schedule().scheduled == [], "its one allowed token is pending: nothing left to compute"
    finish_step(sched, first, {s.seq_id: StepResult(7, 0.0, {})})
    assert s.finish_reason == "length" and s.output_token_ids == [7] and s.num_pending == 0


def test_from_config():
    cfg = EngineConfig(block_size=8, max_num_seqs=4, max_num_batched_tokens=32, policy="bucketed", max_waiting=3)
    sched = Scheduler.from_config(cfg, num_blocks=10, max_model_len=64)
    assert (sched.bm.block_size, sched.max_num_seqs, sched.policy.name, sched.max_waiting) == (8, 4, "bucketed", 3)
    assert sched.policy.batch_buckets == (4,)


def test_every_configurable_policy_has_one_module():
    assert {p.name for p in (DynamicPolicy, BucketedPolicy)} == set(POLICIES)
    with pytest.raises(ValueError, match="policy must be one of"):
        make(policy="greedy")


@pytest.mark.parametrize("policy", ["dynamic", "bucketed"])
def test_random_soak_with_aborts_and_finishes(policy, seed):
    rng = random.Random(f"{policy}-{seed}")
    sched = make(num_blocks=20, block_size=4, max_model_len=60, max_num_seqs=8, max_num_batched_tokens=24,
                 policy=policy)
    runner = sched.__dict__.setdefault("_fake_runner", FakeRunner(sched))
    shared = [rng.randrange(1, VOCAB) for _ in range(20)]
    next_id = 0
    for _ in range(600):
        if rng.random() < 0.3 and sched.can_add_request():
            prompt = shared[: rng.randrange(0, 20)] + [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 25))]
            add(sched, f"q{next_id}", prompt, max_tokens=rng.randrange(1, 30), n=rng.choice([1, 1, 2]))
            next_id += 1
        ready = [s for s in sched.running if not s.in_prefill]
        out = sched.schedule()
        sched.check_integrity()
        check_shape(sched, out)
        if policy == "dynamic":
            check_decodes_served(out, ready)
        if rng.random() < 0.05 and sched.requests:
            sched.abort(rng.choice(sorted(sched.requests)))
        # The processor's decisions, plus now and then an extra stop (of any sequence, as a stop string would).
        extra = [Finish(rng.choice(sched.running), "stop", "</s>")] if rng.random() < 0.05 and sched.running else []
        finish_step(sched, out, run_live(runner, out), extra)
        sched.check_integrity()
    drive(sched)
    assert sched.bm.num_free_blocks == sched.bm.num_blocks and sched.num_preemptions > 0
    assert sched.stats()["prefix_hits"] > 0


def test_random_soak_one_step_ahead(seed):
    """Aborts and stops land while a step is scheduled ahead; every step keeps the scheduler's invariants."""
    rng = random.Random(f"ahead-{seed}")
    sched = make(num_blocks=20, block_size=4, max_model_len=60, max_num_seqs=8, max_num_batched_tokens=24,
                 max_inflight=2)
    runner = sched.__dict__.setdefault("_fake_runner", FakeRunner(sched))
    shared = [rng.randrange(1, VOCAB) for _ in range(20)]
    inflight = None
    for i in range(600):
        if rng.random() < 0.3 and sched.can_add_request():
            prompt = shared[: rng.randrange(0, 20)] + [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 25))]
            add(sched, f"q{i}", prompt, max_tokens=rng.randrange(1, 30), n=rng.choice([1, 1, 2]))
        launched = None
        if sched.has_unfinished():
            out = sched.schedule()
            sched.check_integrity()
            check_shape(sched, out)
            launched = (out, run_live(runner, out, inflight[1] if inflight else None))
        if rng.random() < 0.05 and sched.requests:
            sched.abort(rng.choice(sorted(sched.requests)))
        if inflight is not None:
            extra = [Finish(rng.choice(sched.running), "stop", "</s>")] if rng.random() < 0.05 and sched.running else []
            finish_step(sched, *inflight, extra)
        inflight = launched
        sched.check_integrity()
    if inflight is not None:
        finish_step(sched, *inflight)
    drive(sched)
    assert sched.bm.num_free_blocks == sched.bm.num_blocks and sched.num_preemptions > 0
    assert all(s.num_pending == 0 for seqs in sched.requests.values() for s in seqs)


def check_decodes_served(out, ready):
    # A prefill leaves a token of the budget for each decode after it (policies.py), so every running sequence with
    # one token to compute gets it unless it was preempted (the budget here exceeds max_num_seqs).
    scheduled = {id(x.seq) for x in out.scheduled}
    missed = [s for s in ready if id(s) not in scheduled and s.status is SequenceStatus.RUNNING]
    assert not missed, missed


def run_live(runner, out, previous=None):
    # An abort between schedule() and apply() leaves a freed sequence in the output; the runner already ran it.
    out.scheduled, everything = [x for x in out.scheduled if not x.seq.is_finished], out.scheduled
    try:
        return runner.run(out, previous)
    finally:
        out.scheduled = everything


def test_core_is_torch_free():
    code = ("import sys, samebits.engine.scheduler, samebits.engine.config, samebits.engine.outputs, "
            "samebits.engine.output_processor; "
            "from samebits.engine import Scheduler, SamplingParams; assert 'torch' not in sys.modules")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode == 0


@pytest.mark.parametrize("reserve", [True, False])
def test_a_small_request_behind_a_wide_one_is_admitted_at_once(reserve, monkeypatch):
    """No request holds every running slot: one behind a request of max_num_seqs samples starts at the next step,
    not when the first of them finishes. Negative control: without the reserved slot it waits ~all of their tokens."""
    from samebits.engine.scheduler import scheduler as scheduler_module

    if not reserve:
        monkeypatch.setattr(scheduler_module, "RESERVED_SLOT_EVERY", 1 << 30)
    sched = make(num_blocks=400, max_num_seqs=16, max_num_batched_tokens=64, max_model_len=128)
    add(sched, "wide", [1, 2, 3], n=16, max_tokens=60, ignore_eos=True)
    runner, waited = FakeRunner(sched), None
    for step in range(200):
        if step == 3:
            (small,) = add(sched, "small", [4, 5], max_tokens=2, ignore_eos=True)
        out = sched.schedule()
        finish_step(sched, out, runner.run(out))
        if step >= 3 and waited is None and small.status is not SequenceStatus.WAITING:
            waited = step - 3
    assert sched.per_request_cap == (15 if reserve else 16)
    if reserve:
        assert waited == 0, "admitted in the first step after it arrived"
    else:
        assert waited >= 55, f"FCFS behind 16 running samples of 60 tokens: waited {waited} steps"
