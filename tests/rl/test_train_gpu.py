"""CUDA: the fused backward on the Triton kernels. Gradients within the CPU test's tolerance of transformers' autograd
(fp32); in bf16 at lengths up to 1,000 tokens, the same bits run to run, whatever order a micro-batch lists its
sequences in, and with checkpointed layers. Negative control: dQ accumulated through float atomics
(attention_bwd_atomic_demo.py) changes bits from one run to the next, caught by the same run-to-run check."""
import random

import pytest
import torch

from samebits.kernels.triton import grads as triton_grads
from samebits.kernels.triton.attention_bwd_atomic_demo import attention_bwd_atomic_dq
from samebits.models.synthetic import tiny_hf_config
from samebits.rl.policy import Policy
from samebits.runtime import deterministic_runtime
from tests.rl.test_train_ops import VARIANTS, assert_bf16_error_within_transformers, assert_gradients_match_transformers

pytestmark = pytest.mark.gpu
transformers = pytest.importorskip("transformers")

SHAPE = {"hidden_size": 512, "intermediate_size": 1408, "vocab_size": 1024, "num_attention_heads": 8,
         "num_key_value_heads": 2, "max_position_embeddings": 2048}


@pytest.mark.parametrize("case", sorted(VARIANTS))
def test_cuda_gradients_match_transformers_autograd(case, seed):
    assert_gradients_match_transformers(case, seed, device="cuda")


def test_cuda_bf16_gradient_error_is_transformers_bf16_error(seed):
    """The Triton backward kernels in bf16 (P and dS rounded for the attention MMAs) against transformers' fp32, within
    the CPU test's bounds of transformers' bf16 error."""
    assert_bf16_error_within_transformers(seed, device="cuda")


@pytest.fixture(scope="module")
def bf16_policy():
    hf = tiny_hf_config("llama3", **SHAPE)
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**hf),
                                                          dtype=torch.bfloat16).to("cuda")
    return Policy.from_hf(model)


def batch(seed: int, n: int = 8, shortest: int = 20, longest: int = 900):
    rng = random.Random(seed)
    prompts = [[rng.randrange(3, 1024) for _ in range(rng.randint(shortest, longest))] for _ in range(n)]
    completions = [[rng.randrange(3, 1024) for _ in range(rng.randint(1, 100))] for _ in range(n)]
    weights = [rng.uniform(-1, 1) for _ in range(n)]
    return prompts, completions, weights


def grads(policy, prompts, completions, weights, order=None) -> dict:
    order = order or list(range(len(prompts)))
    with deterministic_runtime():
        policy.zero_grad(set_to_none=True)
        lps = policy.logprobs([prompts[i] for i in order], [completions[i] for i in order])
        sum(weights[i] * lp.sum() for i, lp in zip(order, lps)).backward()
    return {n: p.grad.clone() for n, p in policy.model.named_parameters()}


def differing(a: dict, b: dict) -> list[str]:
    return [n for n in a if not torch.equal(a[n].view(torch.int16), b[n].view(torch.int16))]


def test_bf16_gradients_are_the_same_bits_run_to_run_in_any_order_and_checkpointed(bf16_policy, seed):
    prompts, completions, weights = batch(seed)
    first = grads(bf16_policy, prompts, completions, weights)
    assert not differing(first, grads(bf16_policy, prompts, completions, weights)), "run to run"
    order = list(range(len(prompts)))
    random.Random(seed).shuffle(order)
    assert not differing(first, grads(bf16_policy, prompts, completions, weights, order)), f"order {order}"
    bf16_policy.model.checkpoint_layers = True
    try:
        assert not differing(first, grads(bf16_policy, prompts, completions, weights)), "checkpointed"
    finally:
        bf16_policy.model.checkpoint_layers = False


def test_negative_control_atomic_dq_changes_bits_run_to_run(bf16_policy, seed, monkeypatch):
    """More key-block programs than the H200 has SMs (24 sequences of 600-1,900 tokens, 2 KV heads): they queue,
    and their atomic adds land in another order from run to run. (With fewer, every program starts at once and a
    row's adds arrive in the loop's order nearly always: the race is there, rarely seen.)"""
    prompts, completions, weights = batch(seed, n=24, shortest=600, longest=1900)
    monkeypatch.setattr(triton_grads, "attention_bwd", attention_bwd_atomic_dq)
    first = grads(bf16_policy, prompts, completions, weights)
    for _ in range(8):
        if differing(first, grads(bf16_policy, prompts, completions, weights)):
            return
    pytest.fail("eight runs with atomic dQ gave the same bits: the run-to-run check would miss the race")
