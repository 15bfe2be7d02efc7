"""Drafts in the torch-free scheduler: a decode chunk extended by a drafter's tokens within the budget and the free
blocks, never preempting; the rejected tail rolled back before any block is cached. With a fake model whose draw is a
function of the KV each row reads, outputs with drafts are those without, under preemption, prefix hits, n > 1 and
stops (the engine's bits: tests/engine/spec_decode/test_invariance.py)."""
import random

import pytest

from samebits.engine.outputs import StepResult
from samebits.engine.scheduler import Scheduler
from samebits.engine.sequence import PENDING
from samebits.engine.spec_decode.drafters import decoding
from samebits.engine.spec_decode.verify import accepted_prefix
from tests.engine.scheduler.test_scheduler import VOCAB, FakeRunner, add, check_shape, draw, drive, finish_step, make


class VerifyingRunner(FakeRunner):
    """FakeRunner whose verified rows draw too: row i of a chunk draws from the KV up to its own position, and the
    chunk returns its accepted drafts' draws and the bonus draw (verify.py's rule)."""

    def run(self, out, previous=None):
        sampled = {}
        for item in out.scheduled:
            seq = item.seq
            history = seq.token_ids[:item.context_len]
            assert PENDING not in history, "a verify step reads resolved tokens and drafts only"
            for i, tok in enumerate(history[item.start:]):
                block = self.bm.blocks[seq.block_table[(item.start + i) // self.bm.block_size]]
                assert block.ref_count == 1 and block.hash is None, "writing into a shared or cached block"
                self.kv[self.slot(seq, item.start + i)] = (tok, item.start + i)
            context = [self.kv[self.slot(seq, p)] for p in range(item.context_len)]
            assert context == list(zip(history, range(item.context_len)))
            if item.sample:
                k = len(item.drafts)
                draws = [draw(seq, tuple(context[:end])) for end in range(item.context_len - k, item.context_len + 1)]
                sampled[seq.seq_id] = [StepResult(t, 0.0, {}) for t in draws[:accepted_prefix(item.drafts, draws) + 1]]
        return sampled


def oracle(sched, rng: random.Random, k: int) -> dict[int, list[int]]:
    """Up to k drafts a decoding sequence: the fake model's own continuation, a token in three wrong."""
    drafts = {}
    for seq in decoding(sched.running):
        history, proposal = list(seq.token_ids), []
        for _ in range(rng.randint(0, k)):
            token = draw(seq, tuple(zip(history, range(len(history)))))
            proposal.append(token if rng.random() < 0.7 else (token + 1) % VOCAB)
            history.append(proposal[-1])
        if proposal:
            drafts[seq.seq_id] = proposal
    return drafts


def requests(sched, rng: random.Random, n: int) -> list:
    shared = [rng.randrange(1, VOCAB) for _ in range(12)]
    return [s for i in range(n) for s in add(
        sched, f"q{i}", shared[:rng.randrange(0, 12)] + [rng.randrange(1, VOCAB) for _ in range(rng.randrange(1, 15))],
        max_tokens=rng.randrange(1, 30), n=rng.choice([1, 1, 2]), ignore_eos=rng.random() < 0.5)]


def outputs(seqs) -> dict:
    return {(s.request_id, s.sample_index): (tuple(s.output_token_ids), s.finish_reason) for s in seqs}


def test_outputs_with_drafts_are_those_without(seed):
    rng = random.Random(seed)
    plain = make(num_blocks=24, block_size=4, max_model_len=60, max_num_seqs=8, max_num_batched_tokens=24)
    plain_seqs = requests(plain, random.Random(seed), 30)
    drive(plain)
    expected = outputs(plain_seqs)
    sched = make(num_blocks=24, block_size=4, max_model_len=60, max_num_seqs=8, max_num_batched_tokens=24)
    seqs = requests(sched, random.Random(seed), 30)
    verified = soak(sched, rng)
    assert outputs(seqs) == expected and verified > 20
    assert sched.bm.num_free_blocks == sched.bm.num_blocks and sched.num_preemptions > 0
    assert sched.stats()["prefix_hits"] > 0


def test_negative_control_a_roll_back_that_keeps_the_rejected_rows_is_caught(seed, monkeypatch):
    monkeypatch.setattr(Scheduler, "_roll_back_drafts", lambda self, seq: seq.drop_pending())
    sched = make(num_blocks=24, block_size=4, max_model_len=60, max_num_seqs=8, max_num_batched_tokens=24)
    requests(sched, random.Random(seed), 30)
    with pytest.raises(AssertionError):
        soak(sched, random.Random(seed))


def soak(sched, rng: random.Random) -> int:
    """Step to the end with the oracle's drafts, checking every step; how many chunks verified drafts."""
    runner, verified = VerifyingRunner(sched), 0
    while sched.has_unfinished():
        out = sched.schedule(oracle(sched, rng, 5))
        sched.check_integrity()
        check_shape(sched, out)
        preempted = {id(s) for s in out.preempted}
        assert all(not item.drafts or id(item.seq) not in preempted for item in out.scheduled)
        assert out.num_batched_tokens <= sched.max_num_batched_tokens
        verified += sum(bool(item.drafts) for item in out.scheduled)
        finish_step(sched, out, runner.run(out))
        sched.check_integrity()
    return verified


def test_drafts_take_the_budget_and_blocks_left_and_stop_at_max_tokens():
    sched = make(num_blocks=4, block_size=4, max_model_len=16, max_num_batched_tokens=6)
    (a,) = add(sched, "a", [1, 2, 3], max_tokens=4, ignore_eos=True)
    runner = VerifyingRunner(sched)
    finish_step(sched, out := sched.schedule(), runner.run(out))  # prefill: a holds 4 tokens, one block
    add(sched, "b", [4, 5, 6, 7, 8], max_tokens=1)
    out = sched.schedule({a.seq_id: [9, 9, 9, 9, 9]})
    # b's prefill took 5 of the 6 tokens left after a's decode: no budget for drafts
    assert [(x.seq.request_id, x.num_new_tokens, x.drafts) for x in out.scheduled] == [("a", 1, ()), ("b", 5, ())]
    finish_step(sched, out, runner.run(out))
    out = sched.schedule({a.seq_id: [9, 9, 9, 9, 9]})
    # max_tokens 4 with 2 generated: this step samples at most 2 more, so 1 draft
    assert [(x.seq.request_id, x.drafts) for x in out.scheduled] == [("a", (9,))]
    assert a.token_ids[-2:] == [9, PENDING] and a.num_pending == 2
    finish_step(sched, out, runner.run(out))
    sched.check_integrity()  # the rejected tail's slot and rows are gone
    assert a.num_pending == 0 and a.num_computed_tokens == a.num_tokens - 1 and a.num_generated in (3, 4)
    drive(sched, runner=runner)
    assert a.num_generated == 4 and sched.bm.num_free_blocks == 4
