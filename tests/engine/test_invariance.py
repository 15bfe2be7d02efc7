"""Issue 6's proof on CPU: token ids and logprob bits of a request never depend on the rest of the load."""
import random

import pytest
import torch

from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
from samebits.kernels import get_ops
from samebits.models.synthetic import write_tiny_checkpoint
from tests.kernels.helpers import batch_variant_linear

# Wide enough that vendor matmuls change their blocking with M (the negative control needs that); on the GPU in
# bf16 with head_dim 128, where cuBLAS and SDPA pick kernels by shape.
SHAPES = {
    "cpu": {"hidden_size": 256, "intermediate_size": 512, "vocab_size": 1024, "num_attention_heads": 4,
            "num_key_value_heads": 2},
    "cuda": {"hidden_size": 1024, "intermediate_size": 2816, "vocab_size": 8192, "num_attention_heads": 8,
                 "num_key_value_heads": 2, "num_hidden_layers": 4, "torch_dtype": "bfloat16"},
}


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return request.param


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, device):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama3", seed=1, **SHAPES[device]))


def make(ckpt, device, **kw):
    kw = {"kv_cache_tokens": 16384, "max_num_batched_tokens": 256, "mode": "deterministic", **kw}
    return LLM(model=ckpt, device=device, **kw)


@pytest.fixture(scope="module")
def llm(ckpt, device):
    return make(ckpt, device)


@pytest.fixture(scope="module")
def fast(ckpt, device):
    return make(ckpt, device, mode="fast")


def prompts(n: int, seed: int, lo: int = 3, hi: int = 60) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1024) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def key(out) -> list[tuple]:
    """Token ids and the exact float32 bits of every logprob, per sample."""
    return [(tuple(c.token_ids), torch.tensor(c.token_logprobs, dtype=torch.float32).view(torch.int32).tolist())
            for c in out.outputs]


def run(llm, ps, params) -> list:
    return [key(o) for o in llm.generate(ps, params, use_tqdm=False)]


SAMPLED = SamplingParams(temperature=0.8, seed=7, max_tokens=6, logprobs=0, ignore_eos=True)
GREEDY = SamplingParams(temperature=0.0, max_tokens=6, logprobs=0, ignore_eos=True)


@pytest.mark.parametrize("params", [GREEDY, SAMPLED], ids=["greedy", "t0.8"])
def test_run_to_run_20_repeats(llm, params):
    ps = prompts(3, seed=1)
    first = run(llm, ps, params)
    for _ in range(19):
        assert run(llm, ps, params) == first


def needle_mismatches(llm, trials: int = 3) -> int:
    rng, bad = random.Random(5), 0
    params = SamplingParams(temperature=0.7, seed=11, max_tokens=4, logprobs=0, ignore_eos=True)
    for trial in range(trials):
        needle = prompts(1, seed=100 + trial, lo=20, hi=40)[0]
        alone = run(llm, [needle], params)[0]
        batch = prompts(rng.randint(64, 96), seed=200 + trial)
        at = rng.randrange(len(batch) + 1)
        batch.insert(at, needle)
        bad += run(llm, batch, params)[at] != alone
    return bad


def test_needle_alone_vs_inside_64_to_96_fillers(llm):
    assert needle_mismatches(llm) == 0


def alone_vs_together_mismatches(llm, n: int = 32) -> int:
    ps = prompts(n, seed=3)
    params = SamplingParams(temperature=0.6, seed=21, max_tokens=4, logprobs=0, ignore_eos=True)
    alone = [run(llm, [p], params)[0] for p in ps]
    return sum(a != b for a, b in zip(alone, run(llm, ps, params)))


def test_bs1_vs_bs32(llm):
    assert alone_vs_together_mismatches(llm) == 0


def test_chunked_prefill_replicated_at_many_batch_sizes(ckpt, device):
    small = make(ckpt, device, max_num_batched_tokens=48)
    long_prompt = prompts(1, seed=9, lo=150, hi=150)[0]  # > 3 budgets: cut at several boundaries
    ref = run(small, [long_prompt], SAMPLED)[0]
    for bs in [2, 3, 5, 7, 10, 15, 16, 17]:
        assert all(k == ref for k in run(small, [long_prompt] * bs, SAMPLED)), f"batch {bs}"


@pytest.mark.parametrize("block_size", [16, 64])  # vLLM's page, and CUDA's default (engine/config.py BLOCK_SIZES)
def test_prefix_cache_cold_vs_hot_and_mixed_prefixes(ckpt, device, block_size):
    cached = make(ckpt, device, block_size=block_size)
    uncached = make(ckpt, device, block_size=block_size, enable_prefix_caching=False)
    rng = random.Random(2)
    base = prompts(1, seed=4, lo=200, hi=200)[0]
    ps = [base[:rng.choice([17, 33, 48, 64, 90, 130, 190])] + prompts(1, seed=50 + i, lo=2, hi=9)[0]
          for i in range(12)]
    cold = run(uncached, ps, SAMPLED)
    warm_outs = cached.generate(ps, SAMPLED, use_tqdm=False)
    hot_outs = cached.generate(ps, SAMPLED, use_tqdm=False)
    # Every full page of a prompt but its last token was cached by the warm pass.
    assert all(o.num_cached_tokens >= (len(p) - 1) // block_size * block_size for p, o in zip(ps, hot_outs))
    assert sum(o.num_cached_tokens > 0 for o in hot_outs) >= 6
    assert [key(o) for o in warm_outs] == cold
    assert [key(o) for o in hot_outs] == cold


def test_generate_logprobs_equal_teacher_forced_score(llm):
    ps = prompts(4, seed=6)
    for p, out in zip(ps, llm.generate(ps, SAMPLED, use_tqdm=False)):
        c = out.outputs[0]
        scored = llm.score(p, c.token_ids)
        assert torch.equal(torch.tensor(scored, dtype=torch.float32), torch.tensor(c.token_logprobs, dtype=torch.float32))


def test_preemption_gives_the_same_outputs(ckpt, device):
    ample = make(ckpt, device, max_num_batched_tokens=128)
    tight = make(ckpt, device, kv_cache_tokens=512, max_model_len=256, max_num_batched_tokens=128)
    ps = prompts(10, seed=8, lo=40, hi=70)
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=24, logprobs=0, ignore_eos=True)
    assert run(tight, ps, params) == run(ample, ps, params)
    assert tight.engine.scheduler.num_preemptions > 0


def test_async_scheduling_on_and_off_give_the_same_bits(ckpt, device):
    """CUDA graphs, preemption and stop rules with step N+1 launched before step N's read-back; the CPU side (and its
    negative control, a stale input token) is tests/engine/test_async_scheduling.py."""
    if device == "cpu":
        pytest.skip("covered on the CPU by tests/engine/test_async_scheduling.py with a smaller model")
    kw = {"kv_cache_tokens": 512, "max_model_len": 256, "max_num_batched_tokens": 128}
    ahead, sync = make(ckpt, device, **kw), make(ckpt, device, async_scheduling=False, **kw)
    assert ahead.engine.overlap and not sync.engine.overlap
    ps = prompts(24, seed=12, lo=10, hi=70)
    params = SamplingParams(temperature=0.8, seed=5, max_tokens=32, logprobs=0, stop_token_ids=[7, 11, 13])
    assert run(ahead, ps, params) == run(sync, ps, params)
    assert ahead.engine.scheduler.num_preemptions > 0 and ahead.engine.runner.graphs.graphs


def test_seeds(llm):
    p = prompts(1, seed=12)
    base = {"temperature": 1.0, "max_tokens": 8, "logprobs": 0, "ignore_eos": True}
    a = run(llm, p, SamplingParams(seed=1, **base))[0]
    assert run(llm, p, SamplingParams(seed=1, **base))[0] == a
    assert run(llm, p, SamplingParams(seed=2, **base))[0] != a
    samples = run(llm, p, SamplingParams(seed=1, n=4, **base))[0]
    assert len({s[0] for s in samples}) == 4
    assert samples[0] == a[0]  # sample 0 of n is the n=1 sample: the key is (seed, sample index, position)


def test_drawn_seed_is_reported_and_replays(llm):
    p = prompts(1, seed=13)
    out = llm.generate(p, SamplingParams(temperature=1.0, max_tokens=6, logprobs=0, ignore_eos=True),
                       use_tqdm=False)[0]
    replay = llm.generate(p, SamplingParams(temperature=1.0, max_tokens=6, logprobs=0, ignore_eos=True,
                                            seed=out.seed), use_tqdm=False)[0]
    assert key(replay) == key(out)


def test_negative_control_fast_mode_is_caught(fast, device, monkeypatch):
    """The same comparisons that pass above must catch a kernel whose bits follow the batch: on the GPU fast mode's
    vendor kernels; on the CPU fast mode's linear made batch-variant (tests/kernels/helpers.py), since vendor CPU
    GEMMs need not vary (an Intel Xeon under AVX2,STRICT: 2 of 32 requests here, and 0 needles)."""
    if device == "cpu":
        ops = get_ops("fast", "cpu")
        monkeypatch.setattr(ops, "linear", batch_variant_linear(ops.linear))
    assert needle_mismatches(fast) + alone_vs_together_mismatches(fast) > 0


def test_prompt_logprobs_equal_decode_logprobs_and_score_has_a_clear_name(llm):
    p = prompts(1, seed=12)[0]
    c = llm.generate([p], SAMPLED, use_tqdm=False)[0].outputs[0]
    again = llm.generate([p + c.token_ids], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    steps = again.prompt_logprobs
    assert steps[0] is None and len(steps) == len(p) + len(c.token_ids)
    got = [steps[len(p) + i][t].logprob for i, t in enumerate(c.token_ids)]
    assert torch.equal(torch.tensor(got, dtype=torch.float32), torch.tensor(c.token_logprobs, dtype=torch.float32))
    assert llm.teacher_forced_logprobs(p, c.token_ids) == llm.score(p, c.token_ids) == c.token_logprobs


def test_logprobs_are_vllm_shaped(llm):
    out = llm.generate(prompts(1, seed=13), SamplingParams(temperature=0.9, seed=1, max_tokens=5, logprobs=3,
                                                           ignore_eos=True), use_tqdm=False)[0].outputs[0]
    assert len(out.logprobs) == len(out.token_ids) == 5
    for i, (step, token) in enumerate(zip(out.logprobs, out.token_ids, strict=True)):
        assert step[token].logprob == out.token_logprobs[i]
        tops = list(out.top_logprobs[i].items())
        assert [(step[t].logprob, step[t].rank) for t, _ in tops] == [(lp, r) for r, (_, lp) in enumerate(tops, 1)]
        assert step[token].decoded_token == llm.tokenizer.decode([token], skip_special_tokens=False)


def test_sampled_token_rank_is_its_real_rank_outside_the_top_k(llm):
    """vLLM's rank for a sampled token outside the top-k (here k=0): how many tokens of its row are at least as
    likely, the count prompt_logprobs gives the same token at the same place (the rows are bit-equal)."""
    p = prompts(1, seed=14)[0]
    c = llm.generate([p], SamplingParams(temperature=2.0, seed=3, max_tokens=6, logprobs=0, ignore_eos=True),
                     use_tqdm=False)[0].outputs[0]
    again = llm.generate([p + c.token_ids], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    ranks = [step[t].rank for step, t in zip(c.logprobs, c.token_ids)]
    assert ranks == [again.prompt_logprobs[len(p) + i][t].rank for i, t in enumerate(c.token_ids)]
    assert max(ranks) > 1, "temperature 2 on a random model samples past the most likely token"
    assert llm.generate([p], SamplingParams(max_tokens=2), use_tqdm=False)[0].outputs[0].token_ranks is None


def test_penalised_request_alone_equals_batched(llm):
    """The penalties read each row's own history through the runner: batching and neighbours change no bit."""
    # Greedy on a random model repeats itself, so the penalties move tokens (the negative control below).
    params = SamplingParams(temperature=0.0, max_tokens=10, logprobs=0, ignore_eos=True,
                            presence_penalty=2.0, frequency_penalty=1.0, repetition_penalty=1.5)
    p = prompts(1, seed=14)[0]
    alone = key(llm.generate([p], params, use_tqdm=False)[0])
    others = prompts(5, seed=15)
    mixed = [params if i % 2 else SAMPLED for i in range(5)]
    outs = llm.generate(others[:2] + [p] + others[2:], mixed[:2] + [params] + mixed[2:], use_tqdm=False)
    assert key(outs[2]) == alone
    plain = key(llm.generate([p], SamplingParams(temperature=0.0, max_tokens=10, logprobs=0, ignore_eos=True),
                             use_tqdm=False)[0])
    assert plain != alone  # negative control: the penalties act on this prompt
