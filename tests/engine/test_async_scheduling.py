"""Async scheduling (llm_engine.py): step N+1 launched before step N is read back gives every request the same bits."""
import struct

import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.model_runner import ModelRunner
from samebits.engine.sampling_params import SamplingParams
from samebits.models import load_model
from samebits.models.synthetic import write_tiny_checkpoint
from tests.engine.drive import drive


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    path = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama3", seed=11)
    return str(path), load_model(str(path), "deterministic", "cpu", None)


def engine(loaded, overlap: bool, **kw) -> LLMEngine:
    path, model = loaded
    config = EngineConfig(model=path, device="cpu", async_scheduling=overlap, max_model_len=128, **kw)
    return LLMEngine(config, model)


def workload(seed: int) -> list[tuple[list[int], SamplingParams]]:
    """Shared prefixes, greedy and sampled rows, n=2, stop strings and ids, eos, top logprobs, varied lengths;
    penalties (the engine reads back before a penalised row samples), min_tokens and logit_bias."""
    import random

    rng = random.Random(seed)
    shared = [rng.randrange(3, 320) for _ in range(40)]
    reqs = []
    for i in range(10):
        prompt = shared[:rng.randrange(0, 40)] + [rng.randrange(3, 320) for _ in range(rng.randrange(1, 30))]
        params = SamplingParams(temperature=rng.choice([0.0, 0.8, 1.0]), top_p=rng.choice([1.0, 0.9]),
                                seed=rng.randrange(1 << 30), n=rng.choice([1, 1, 2]),
                                max_tokens=rng.randrange(1, 24), ignore_eos=rng.random() < 0.5,
                                logprobs=rng.choice([None, 0, 2]), stop=rng.choice([None, ["e"], ["th"]]),
                                presence_penalty=rng.choice([0.0, 0.0, 0.5]), min_tokens=rng.choice([0, 1]),
                                logit_bias=rng.choice([None, {5: 3.0}]))
        reqs.append((prompt, params))
    return reqs


def run(eng: LLMEngine, reqs) -> dict:
    ahead = [0]

    def after_step(e) -> None:
        ahead[0] = max(ahead[0], len(e.scheduler._pending))
        e.scheduler.check_integrity()

    final = drive(eng, reqs, on_step=after_step)
    assert eng._inflight is None and not eng.scheduler._pending, "an idle engine holds no step in flight"
    assert eng.scheduler.bm.num_free_blocks == eng.scheduler.bm.num_blocks
    return {rid: [(c.token_ids, bits(c.token_logprobs), c.top_logprobs, c.text, c.finish_reason, c.stop_reason)
                  for c in out.outputs] for rid, out in final.items()}, ahead[0]


def bits(logprobs):
    return None if logprobs is None else [struct.pack("<f", x) for x in logprobs]


@pytest.mark.parametrize("kv_cache_tokens", [4096, 320])  # 320: preemption by recompute while a step is ahead
def test_bits_equal_with_and_without_async_scheduling(loaded, kv_cache_tokens, seed):
    # Four long greedy requests need 4 x 100 tokens of KV at once: with 320, preemption is certain, whatever the seed.
    long = [([7 + i] * 60, SamplingParams(temperature=0.0, max_tokens=40, ignore_eos=True)) for i in range(4)]
    reqs = long + workload(seed)
    sync, depth_sync = run(engine(loaded, False, kv_cache_tokens=kv_cache_tokens, max_num_seqs=8), reqs)
    ahead_engine = engine(loaded, True, kv_cache_tokens=kv_cache_tokens, max_num_seqs=8)
    ahead, depth = run(ahead_engine, reqs)
    assert depth_sync == 0 and depth == 1, "between steps the async engine holds the step it launched ahead"
    assert len(sync) == len(reqs) and ahead == sync
    if kv_cache_tokens == 320:
        assert ahead_engine.scheduler.num_preemptions > 0


def test_negative_control_a_stale_input_token_is_caught(loaded, seed, monkeypatch):
    """Feeding the last read-back token instead of the pending draw (the bug async scheduling invites) differs."""
    reqs = workload(seed)
    sync, _ = run(engine(loaded, False, kv_cache_tokens=4096), reqs)

    def stale(self, scheduled, ends, previous):
        for s in scheduled:
            if s.seq.token_ids[s.context_len - 1] < 0:
                s.seq.token_ids[s.context_len - 1] = s.seq.token_ids[s.context_len - 2]

    monkeypatch.setattr(ModelRunner, "_pending_filler", stale)
    broken, _ = run_tolerant(engine(loaded, True, kv_cache_tokens=4096), reqs)
    assert broken != sync


def run_tolerant(eng, reqs):
    """run() for the broken runner: its overwritten slots are resolved later, so only the outputs are compared."""
    final = drive(eng, reqs)
    return {rid: [(c.token_ids, bits(c.token_logprobs)) for c in out.outputs] for rid, out in final.items()}, None


def test_abort_while_a_step_is_ahead_frees_everything(loaded):
    eng = engine(loaded, True, kv_cache_tokens=4096)
    eng.add_request("a", [5] * 20, SamplingParams(max_tokens=30, ignore_eos=True))
    eng.add_request("b", [6] * 20, SamplingParams(max_tokens=30, ignore_eos=True))
    for _ in range(4):
        eng.step()
    assert len(eng.scheduler._pending) == 1 and eng._inflight is not None
    eng.abort_request("a")
    eng.step()
    eng.abort_request("b")
    assert eng._inflight is None and not eng.has_unfinished_requests()
    eng.scheduler.check_integrity()
    assert eng.scheduler.bm.num_free_blocks == eng.scheduler.bm.num_blocks


def test_async_scheduling_defaults_to_the_device(loaded):
    assert engine(loaded, None).overlap is False, "on the CPU the host computes the step: nothing to overlap"
    with pytest.raises(ValueError, match="async_scheduling must be None or a bool"):
        EngineConfig(async_scheduling="yes")


@pytest.mark.parametrize("overlap", [False, True])
def test_running_outputs_are_views_that_never_change_and_the_final_one_holds_lists(loaded, overlap):
    """A running request's output shares the engine's lists through read-only views (no copy a step): each one kept
    still reads what it read when it was returned after every later step (pending draws resolved, dropped draws
    removed), and equals a prefix of the final output, whose sequences are lists."""
    from samebits.engine.outputs import ListView

    eng = engine(loaded, overlap)
    kept = []  # (output, the values it showed when returned)

    def snapshot(out):
        return [(list(c.token_ids), None if c.token_logprobs is None else list(c.token_logprobs),
                 None if c.top_logprobs is None else list(c.top_logprobs), c.text) for c in out.outputs]

    def on_output(out):
        kept.append((out, snapshot(out)))

    final = drive(eng, workload(21), on_output=on_output)
    views = 0
    for out, then in kept:
        assert snapshot(out) == then  # nothing a later step did shows through
        views += not out.finished and isinstance(out.outputs[0].token_ids, ListView)
        last = final[out.request_id]
        for c, (ids, lps, tops, _) in zip(last.outputs, then):
            assert list(c.token_ids[:len(ids)]) == ids
            assert lps is None or struct.pack(f"<{len(lps)}d", *lps) == struct.pack(
                f"<{len(lps)}d", *c.token_logprobs[:len(lps)])
            assert tops is None or list(c.top_logprobs[:len(tops)]) == tops
    assert views > 0
    for out in final.values():
        for c in out.outputs:
            assert type(c.token_ids) is list
            assert c.token_logprobs is None or type(c.token_logprobs) is list
            assert c.top_logprobs is None or type(c.top_logprobs) is list
