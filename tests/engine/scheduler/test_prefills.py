"""Prefill fairness (engine/scheduler/prefills.py), counted in steps: a short prompt behind a long one's prefill starts
at the next step, a waiting long prompt is passed over while another is partial, an abort mid-prefill frees the
engine at the next step. Each with the old policy (no cap) as the negative control."""
from __future__ import annotations

import pytest

from samebits.engine.scheduler.prefills import PrefillLimits
from samebits.engine.sequence import SequenceStatus
from tests.engine.scheduler.test_scheduler import FakeRunner, add, drive, finish_step, make, results

LONG = 8000
BUDGET = 2048


def _long_prefill_scheduler(threshold):
    sched = make(num_blocks=2200, block_size=4, max_model_len=LONG + 64, max_num_batched_tokens=BUDGET,
                 prefill=PrefillLimits(threshold))
    (long,) = add(sched, "long", [1 + i % 37 for i in range(LONG)], max_tokens=2, ignore_eos=True)
    return sched, long


def _steps_to_first_token(sched, seq, runner, limit=20) -> tuple[int, list[int]]:
    """Steps until seq samples its first token, and each step's batch size in tokens."""
    sizes = []
    for step in range(1, limit + 1):
        out = sched.schedule()
        sizes.append(out.num_batched_tokens)
        finish_step(sched, out, runner.run(out))
        if seq.num_generated:
            return step, sizes
    return limit + 1, sizes


@pytest.mark.parametrize("threshold", [None, 0])
def test_a_short_request_behind_an_8000_token_prompt_starts_at_the_next_step(threshold):
    """The issue's case: one step of the long prompt's chunk is in flight when a 2-token request arrives; it gets its
    first token from the step after, whose batch is no larger than that chunk, so within twice the time of one step
    of the long prompt's chunk. Negative control: with no cap (0) the long prompt takes the whole budget every step
    and the short one waits for its whole prefill."""
    sched, long = _long_prefill_scheduler(threshold)
    runner = FakeRunner(sched)
    first = sched.schedule()
    assert first.num_batched_tokens == BUDGET, "alone, the long prompt takes the whole budget"
    (short,) = add(sched, "short", [5, 6], max_tokens=2, ignore_eos=True)
    finish_step(sched, first, runner.run(first))
    steps, sizes = _steps_to_first_token(sched, short, runner)
    if threshold is None:
        assert steps == 1 and sizes[0] <= BUDGET, (steps, sizes)
        assert long.num_computed_tokens == BUDGET + BUDGET // 2, "the long prompt went on at the capped chunk"
    else:
        assert steps == -(-(LONG - BUDGET) // BUDGET) == 3, "started beside the long prompt's last chunk"
    drive(sched, runner=runner)
    assert long.finish_reason == short.finish_reason == "length"


def test_decodes_keep_their_token_and_the_cap_holds_only_while_someone_waits():
    """A short request admitted beside a long prefill decodes next to it every step. The long prompt is capped while
    the short one waits to start, then takes the budget less the decode's token (vLLM caps "when others wait": a
    decode needs one token, which it keeps anyway)."""
    sched, _ = _long_prefill_scheduler(None)
    runner = FakeRunner(sched)
    finish_step(sched, out := sched.schedule(), runner.run(out))
    (short,) = add(sched, "short", [5, 6], max_tokens=5, ignore_eos=True)
    chunks = []
    while short.status is not SequenceStatus.FINISHED_LENGTH:
        out = sched.schedule()
        chunks.append([(x.seq.request_id, x.num_new_tokens) for x in out.scheduled])
        finish_step(sched, out, runner.run(out))
    rest = LONG - BUDGET - BUDGET // 2 - 2 * (BUDGET - 1)
    assert chunks == [[("long", BUDGET // 2), ("short", 2)], [("long", BUDGET - 1), ("short", 1)],
                      [("long", BUDGET - 1), ("short", 1)], [("long", rest), ("short", 1)], [("long", 1), ("short", 1)]]


@pytest.mark.parametrize("always", [False, True], ids=["default", "cap-always"])
def test_a_burst_of_long_prompts_fills_every_step(monkeypatch, always):
    """Four 8,000-token prompts at once: one is partly prefilled at a time (the limits pass the others over), so the
    cap, which would leave half of each step to nobody, is not applied: every step but the last is the whole budget,
    as with no cap. Negative control: a cap applied whenever others wait leaves steps of half the budget."""
    sched = make(num_blocks=8200, block_size=4, max_model_len=LONG + 64, max_num_batched_tokens=BUDGET,
                 prefill=PrefillLimits())
    if always:
        monkeypatch.setattr(sched.policy, "_cap_for", lambda planner: sched.policy.cap)
    seqs = [s for i in range(4) for s in add(sched, f"r{i}", [1 + (i + j) % 37 for j in range(LONG)], max_tokens=1)]
    runner, sizes = FakeRunner(sched), []
    while any(s.num_generated == 0 for s in seqs):
        out = sched.schedule()
        sizes.append(out.num_batched_tokens)
        finish_step(sched, out, runner.run(out))
    if always:
        assert sizes.count(BUDGET // 2) > 8, sizes
    else:
        assert sizes[:-1] == [BUDGET] * (len(sizes) - 1) and len(sizes) == -(-4 * LONG // BUDGET), sizes


@pytest.mark.parametrize("max_long", [1, 2])
def test_a_waiting_long_prompt_is_passed_over_while_another_is_partial(max_long):
    """max_long_partial_prefills=1: the long prompts behind a partial one wait for it, the short one behind them starts
    at once. With room for two long partial prefills the second starts too, and the third waits for a partial slot
    (max_num_partial_prefills=2)."""
    sched = make(num_blocks=400, block_size=4, max_model_len=512, max_num_batched_tokens=64,
                 prefill=PrefillLimits(16, max_partial=2, max_long_partial=max_long))
    (a,) = add(sched, "a", [1] * 200, max_tokens=1)
    (b,) = add(sched, "b", [2] * 200, max_tokens=1)
    (c,) = add(sched, "c", [3] * 40, max_tokens=1)
    (d,) = add(sched, "d", [4] * 3, max_tokens=1)
    out = sched.schedule()
    chunks = [(x.seq.request_id, x.num_new_tokens) for x in out.scheduled]
    assert chunks == ([("a", 16), ("d", 3)] if max_long == 1 else [("a", 16), ("b", 16), ("d", 3)])
    assert c.status is SequenceStatus.WAITING and d.status is SequenceStatus.RUNNING
    runner = sched.__dict__.setdefault("_fake_runner", FakeRunner(sched))
    finish_step(sched, out, runner.run(out))
    drive(sched)
    assert all(s.finish_reason == "length" for s in (a, b, c, d))


def test_abort_mid_prefill_frees_the_engine_at_the_next_step():
    """An abort between steps ends a long prefill at once: the next step runs only the new request, every block of
    the aborted one is free. Negative control: not aborted, the long prompt's chunk is in that step too."""
    for abort in (True, False):
        sched, long = _long_prefill_scheduler(None)
        runner = FakeRunner(sched)
        finish_step(sched, out := sched.schedule(), runner.run(out))
        if abort:
            sched.abort("long")
            assert not long.block_table and sched.bm.num_free_blocks == sched.bm.num_blocks
        (short,) = add(sched, "short", [5, 6], max_tokens=1)
        out = sched.schedule()
        assert [x.seq.request_id for x in out.scheduled] == (["short"] if abort else ["long", "short"])
        finish_step(sched, out, runner.run(out))
        assert short.num_generated == 1
        sched.check_integrity()


def test_fairness_changes_who_runs_together_never_the_tokens():
    """The same requests under the cap, the partial limits and the old policy give the same tokens."""
    prompts = {f"r{i}": [1 + (i * 7 + j) % 37 for j in range(5 + 23 * (i % 4))] for i in range(12)}

    def run(limits):
        sched = make(num_blocks=400, block_size=4, max_model_len=128, max_num_batched_tokens=32, prefill=limits)
        seqs = [s for rid, p in prompts.items() for s in add(sched, rid, p, max_tokens=6, ignore_eos=True)]
        drive(sched)
        return results(seqs)

    outcomes = [run(limits) for limits in (PrefillLimits(0), PrefillLimits(), PrefillLimits(4, 3, 1),
                                           PrefillLimits(1, 1, 1))]
    assert all(o == outcomes[0] for o in outcomes[1:])
