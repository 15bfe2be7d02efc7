"""Verify graphs' inputs, checked on the CPU without a capture: the static buffers a graph replays over (each chunk
left-padded to 1 + k rows, dummy sequences up to the batch bucket) give every real row the bits of the eager step.
On CUDA the graphs themselves run in test_gpu.py."""
import collections
import random

from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.spec_decode.graphs import VerifyGraphs
from samebits.models.synthetic import write_tiny_checkpoint
from samebits.probe.compare import assert_same_bits


def test_padded_rows_give_the_eager_steps_bits(tmp_path):
    ckpt = write_tiny_checkpoint(tmp_path, "llama3", seed=1)
    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    engine = LLMEngine(EngineConfig(str(ckpt), device="cpu", kv_cache_tokens=2048, speculative_config=spec))
    runner = engine.runner
    graphs = VerifyGraphs(runner.model, runner.kv_caches, runner.block_size, runner.scratch_block,
                          engine.max_model_len, 8, 4)
    rng = random.Random(0)
    for i in range(5):  # 5 sequences: a batch bucket of 8, three dummies
        engine.add_request(f"r{i}", [rng.randrange(3, 12) for _ in range(rng.randint(2, 9))],
                           SamplingParams(temperature=0.0, max_tokens=14, ignore_eos=True))
    checked = 0
    while engine.has_unfinished_requests():
        out = engine.scheduler.schedule(engine.speculator.propose(engine.scheduler.running))
        key = graphs.graph_key(out)
        if key is not None:
            graphs.fill(out.scheduled, key[0])
            padded = graphs.real_rows(graphs._eager(*key), out.scheduled)
            assert_same_bits(padded, runner.forward(out.scheduled), f"verify step {checked}")
            checked += 1
        engine._finish_step((out, runner.execute(out), True))
    assert checked >= 3 and engine.speculator.stats.num_accepted_tokens > 0
    assert graphs.graph_key(out) is None or not any(s.drafts for s in out.scheduled)


def test_steps_a_graph_does_not_take():
    graphs = VerifyGraphs.__new__(VerifyGraphs)
    graphs.q, graphs.buckets, graphs.max_model_len = 5, (1, 2, 4), 64
    graphs.failed_captures = collections.Counter()

    class Item:
        def __init__(self, n, drafts, sample=True, context=20):
            self.num_new_tokens, self.drafts, self.sample, self.context_len = n, drafts, sample, context

    class Out:
        def __init__(self, items, padding=()):
            self.scheduled, self.padding = items, padding

    assert graphs.graph_key(Out([Item(3, (1, 2)), Item(1, ())])) == (2, graphs.grid_len(20))
    assert graphs.graph_key(Out([Item(1, ())])) is None  # no drafts: the decode graphs' step
    assert graphs.graph_key(Out([Item(3, (1, 2)), Item(7, (), sample=False)])) is None  # a prefill chunk
    assert graphs.graph_key(Out([Item(3, (1, 2), context=4)])) is None  # fewer tokens than rows to pad with
    assert graphs.graph_key(Out([Item(3, (1, 2))] * 5)) is None  # past the largest bucket
    assert graphs.graph_key(Out([Item(3, (1, 2), context=65)])) is None  # past max_model_len
