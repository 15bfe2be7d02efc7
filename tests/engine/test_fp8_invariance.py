"""FP8 models in the engine: a request's tokens and logprob bits never depend on the rest of the load, prefill equals
decode, CUDA graphs change no bit; per-tensor dynamic activation scales (fast mode) are caught by the same checks.

Two recipes: the block-scaled checkpoint format (Qwen3-*-FP8: activations per token and 128-group) and
`--quantization fp8` over a dense checkpoint (per-row weights, per-token activations; on the GPU the proven vendor
route where its self-test passes). On the GPU an 8B-like shape at small size (head_dim 128, GQA 4:1, bf16)."""
import random

import pytest
import torch

from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
from samebits.models.synthetic import write_tiny_checkpoint
from samebits.models.synthetic_fp8 import write_tiny_fp8_checkpoint

SHAPES = {
    "cpu": {"hidden_size": 256, "intermediate_size": 512, "vocab_size": 1024, "num_attention_heads": 4,
            "num_key_value_heads": 2, "head_dim": 64},
    "cuda": {"hidden_size": 1024, "intermediate_size": 2816, "vocab_size": 8192, "num_attention_heads": 8,
             "num_key_value_heads": 2, "head_dim": 128, "num_hidden_layers": 4, "torch_dtype": "bfloat16"},
}
PARAMS = SamplingParams(temperature=0.7, seed=11, max_tokens=4, logprobs=0, ignore_eos=True)


@pytest.fixture(scope="module", params=["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
def device(request):
    return request.param


@pytest.fixture(scope="module", params=["block", "online"])
def source(request, tmp_path_factory, device):
    """(checkpoint folder, quantization flag) of the FP8 model. The CPU runs the online one: the block recipe's CPU
    route is proven row-invariant at the op (tests/kernels/test_fp8.py), and the engine's CPU steps are slow."""
    if request.param == "block" and device == "cpu":
        pytest.skip("block-scaled FP8 in the engine: on the GPU")
    root = tmp_path_factory.mktemp(f"fp8-{request.param}")
    if request.param == "block":
        return str(write_tiny_fp8_checkpoint(root, "block", "llama3", seed=1, **SHAPES[device])), None
    return str(write_tiny_checkpoint(root, "llama3", seed=1, **SHAPES[device])), "fp8"


def make(source, device, **kw):
    path, flag = source
    kw = {"kv_cache_tokens": 8192, "max_num_batched_tokens": 256, "mode": "deterministic", "quantization": flag, **kw}
    return LLM(model=path, device=device, **kw)


@pytest.fixture(scope="module")
def llm(source, device):
    return make(source, device)


def prompts(n: int, seed: int, lo: int = 3, hi: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, 1024) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


def key(out) -> list[tuple]:
    return [(tuple(c.token_ids), torch.tensor(c.token_logprobs, dtype=torch.float32).view(torch.int32).tolist())
            for c in out.outputs]


def run(llm, ps, params=PARAMS) -> list:
    return [key(o) for o in llm.generate(ps, params, use_tqdm=False)]


def mismatches(llm, fillers: int) -> int:
    """A needle alone vs at a random place among `fillers` others, then a few prompts alone vs together."""
    rng = random.Random(5)
    needle = prompts(1, seed=100, lo=20, hi=30)[0]
    batch = prompts(fillers, seed=200)
    at = rng.randrange(len(batch) + 1)
    batch.insert(at, needle)
    bad = run(llm, batch)[at] != run(llm, [needle])[0]
    few = prompts(4, seed=3)
    return bad + sum(a != b for a, b in zip(run(llm, few), [run(llm, [p])[0] for p in few]))


def test_alone_vs_loaded(llm, device):
    assert llm.engine.loaded.model.recipe is not None
    assert mismatches(llm, 16 if device == "cpu" else 96) == 0


def test_prefill_equals_decode(llm):
    p = prompts(1, seed=12)[0]
    c = llm.generate([p], PARAMS, use_tqdm=False)[0].outputs[0]
    again = llm.generate([p + c.token_ids], SamplingParams(max_tokens=1, prompt_logprobs=0), use_tqdm=False)[0]
    got = [again.prompt_logprobs[len(p) + i][t].logprob for i, t in enumerate(c.token_ids)]
    assert torch.equal(torch.tensor(got, dtype=torch.float32), torch.tensor(c.token_logprobs, dtype=torch.float32))


def test_chunked_prefill_and_cuda_graphs_change_no_bit(source, device, llm):
    if device == "cpu":
        pytest.skip("the CPU runs no graphs; chunking on the CPU is tests/engine/test_invariance.py's")
    long_prompt = prompts(1, seed=9, lo=300, hi=300)[0]
    ref = run(llm, [long_prompt])[0]
    small = make(source, device, max_num_batched_tokens=48)
    assert all(k == ref for k in run(small, [long_prompt] * 5))
    eager = make(source, device, cuda_graphs=False)
    ps = prompts(12, seed=13)
    assert run(eager, ps) == run(llm, ps) and llm.engine.runner.graphs.graphs


def test_prefix_cache_cold_vs_hot(source, device, llm):
    """Prompts sharing 17-150 tokens of a prefix (three past a CUDA page) give the same bits with their prefix's KV
    cached as computed afresh."""
    base = prompts(1, seed=4, lo=150, hi=150)[0]
    ps = [base[:n] + prompts(1, seed=50 + n, lo=2, hi=6)[0] for n in (17, 70, 100, 150)]
    cold = run(make(source, device, enable_prefix_caching=False), ps)
    run(llm, ps)
    hot = llm.generate(ps, PARAMS, use_tqdm=False)
    assert sum(o.num_cached_tokens > 0 for o in hot) >= 3
    assert [key(o) for o in hot] == cold


# (KV pool tokens, max_model_len, prompts, their lengths, output tokens): more blocks wanted than the pool holds, at
# the CPU's 16-token and CUDA's 64-token pages.
TIGHT = {"cpu": (256, 128, 6, (30, 50), 12), "cuda": (512, 256, 10, (40, 70), 24)}


def test_preemption_and_async_scheduling_change_no_bit(source, device, llm):
    pool, max_len, n, (lo, hi), out = TIGHT[device]
    ps = prompts(n, seed=8, lo=lo, hi=hi)
    params = SamplingParams(temperature=0.8, seed=3, max_tokens=out, logprobs=0, ignore_eos=True)
    ref = run(llm, ps, params)
    tight = make(source, device, kv_cache_tokens=pool, max_model_len=max_len, max_num_batched_tokens=64)
    assert run(tight, ps, params) == ref
    assert tight.engine.scheduler.num_preemptions > 0
    overlap = not llm.engine.overlap  # the other setting than this device's default
    other = make(source, device, async_scheduling=overlap)
    assert other.engine.overlap == overlap and run(other, ps, params) == ref


def test_negative_control_per_tensor_dynamic_scales_are_caught(source, device):
    """The same checks catch fast mode with per-tensor dynamic activation scales (the batch's max sets every row's
    scale), which deterministic mode refuses."""
    if source[1] is None:
        pytest.skip("block-scaled weights take per-group activations only; the control runs on the dense source")
    fast = make(source, device, mode="fast", quantization="fp8_per_tensor")
    assert fast.engine.loaded.model.recipe.activations == "tensor"
    assert mismatches(fast, 16 if device == "cpu" else 96) > 0


def test_what_fp8_models_do_not_do_is_refused(llm, source, device):
    from samebits.engine.weights import WeightsError

    with pytest.raises(WeightsError, match="FP8 models are not supported"):
        llm.update_weights({})
    with pytest.raises(ValueError, match="FP8 model runs at tensor_parallel_size=1"):
        make(source, device, all_reduce="invariant")
