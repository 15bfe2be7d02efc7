"""Speculative decoding on CUDA: plain decoding's bits with verify steps in CUDA graphs (and eagerly), async
scheduling between tries, preemption, an FP8 target; a verify graph's real rows equal the eager step's."""
import random

import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.llm import LLM
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import SamplingParams
from samebits.models.synthetic import write_tiny_checkpoint
from samebits.models.synthetic_fp8 import write_tiny_fp8_checkpoint
from samebits.probe.compare import assert_same_bits
from tests.engine.spec_decode.test_invariance import COOL, GREEDY, bits, constrained, ngram, prompts

pytestmark = pytest.mark.gpu

# bf16, head_dim 128, wide enough that vendor kernels would pick by shape (tests/engine/test_invariance.py's CUDA one).
SHAPE = {"hidden_size": 1024, "intermediate_size": 2816, "vocab_size": 8192, "num_attention_heads": 8,
         "num_key_value_heads": 2, "num_hidden_layers": 4, "torch_dtype": "bfloat16"}
ENGINE = {"device": "cuda", "kv_cache_tokens": 16384, "max_num_batched_tokens": 512}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("cuda"), "llama3", seed=1, **SHAPE))


def run(llm, ps, params) -> list:
    return [bits(o) for o in llm.generate(ps, params, use_tqdm=False)]


@pytest.fixture(scope="module")
def plain(ckpt):
    ps = prompts(24, 5)
    params = [GREEDY if i % 2 else COOL for i in range(24)]
    return ps, params, run(LLM(ckpt, **ENGINE), ps, params)


@pytest.mark.parametrize("graphs", [True, False])
@pytest.mark.parametrize("spec", ["ngram", "draft"])
def test_plain_decodings_bits_on_cuda(ckpt, plain, spec, graphs):
    ps, params, expected = plain
    config = ngram(4) if spec == "ngram" else {"method": "draft_model", "model": ckpt, "num_speculative_tokens": 4}
    llm = LLM(ckpt, speculative_config=config, cuda_graphs=graphs, **ENGINE)
    assert run(llm, ps, params) == expected
    engine = llm.engine
    assert engine.overlap and engine.stats().spec_num_accepted_tokens > 0
    assert bool(engine.runner.verify_graphs and engine.runner.verify_graphs.graphs) == graphs


def test_preempted_in_a_small_pool_on_cuda(ckpt):
    """Prompts of 48-60 tokens, so every sequence outgrows its first 64-token CUDA page while it decodes (with the
    plain fixture's prompts, at most 40 + 12 tokens, none did and nothing was preempted on the H200), in a pool of
    ten pages."""
    ps = [(p * 60)[:max(len(p), 48)] for p in prompts(24, 7, longest=60)]
    params = [GREEDY if i % 2 else COOL for i in range(24)]
    expected = run(LLM(ckpt, **ENGINE), ps, params)
    llm = LLM(ckpt, speculative_config=ngram(4), **{**ENGINE, "kv_cache_tokens": 640})
    assert run(llm, ps, params) == expected
    assert llm.engine.stats().num_preemptions > 0


def test_a_verify_graphs_rows_equal_the_eager_steps(ckpt):
    engine = LLMEngine(EngineConfig(ckpt, device="cuda", kv_cache_tokens=8192, speculative_config=ngram(4)))
    runner, rng = engine.runner, random.Random(0)
    for i in range(5):  # a bucket of 8: three dummy sequences
        engine.add_request(f"r{i}", [rng.randrange(3, 12) for _ in range(rng.randint(5, 40))],
                           SamplingParams(temperature=0.0, max_tokens=24, ignore_eos=True))
    checked = 0
    while engine.has_unfinished_requests():
        engine.drain()
        out = engine.scheduler.schedule(engine.speculator.propose(engine.scheduler.running))
        key = runner.verify_graphs.graph_key(out)
        if key is not None:
            graphed = runner.verify_graphs.forward(out.scheduled, key).clone()
            assert_same_bits(graphed, runner.forward(out.scheduled), f"verify step {checked}")
            checked += 1
        engine._finish_step((out, runner.execute(out), True))
    assert checked >= 3


def test_an_fp8_target_on_cuda(tmp_path):
    """A block-scaled FP8 checkpoint (Qwen3-*-FP8's format): verify steps in graphs give plain decoding's bits."""
    path = str(write_tiny_fp8_checkpoint(tmp_path, "block", "llama3", seed=1, **SHAPE))
    ps, params = prompts(8, 6), [GREEDY, COOL] * 4
    expected = run(LLM(path, **ENGINE), ps, params)
    llm = LLM(path, speculative_config=ngram(4), **ENGINE)
    assert run(llm, ps, params) == expected
    assert llm.engine.stats().spec_num_accepted_tokens > 0 and llm.engine.runner.verify_graphs.graphs


def test_constrained_requests_among_speculating_ones_on_cuda(ckpt):
    """Grammar rows in verify steps (in graphs) and in the async plain steps between tries (DeferredStep)."""
    ps, params = prompts(8, 7), [constrained(3), GREEDY, COOL, constrained(4)] * 2
    expected = run(LLM(ckpt, **ENGINE), ps, params)
    llm = LLM(ckpt, speculative_config=ngram(4), **ENGINE)
    assert run(llm, ps, params) == expected
    assert llm.engine.overlap and llm.engine.stats().spec_num_accepted_tokens > 0
