"""The trainer on a mixture of experts: its logprobs are the rollout's bits in any micro-batching, and its backward
(reference math through the experts) reaches the experts and the router."""
import pytest
import torch

from samebits.engine.llm import LLM
from samebits.models.synthetic import write_tiny_checkpoint
from samebits.rl.policy import Policy
from samebits.rl.rollout import completions_of
from tests.rl.conftest import ENGINE, SAMPLED, random_prompts
from tests.rl.test_policy import bits, shuffled_microbatches

VOCAB = 320


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("rl-moe"), "mixtral", seed=2, num_local_experts=8))


def test_policy_logprobs_equal_the_rollouts_and_backward_reaches_the_experts(ckpt, seed):
    llm = LLM(model=ckpt, **ENGINE)
    prompts = [[t % VOCAB for t in p] for p in random_prompts(4, seed=21)]
    completions, reported = completions_of(llm.generate(prompts, SAMPLED, use_tqdm=False))
    policy = Policy.from_pretrained(ckpt, device="cpu")
    for lp, rep in zip(shuffled_microbatches(policy, prompts, completions, seed), reported):
        assert bits(lp) == bits(rep)
    loss = -sum(lp.sum() for lp in policy.logprobs(prompts[:2], completions[:2]))
    loss.backward()
    layer = policy.model.layers[0]
    for p in (layer.experts_gate_up, layer.experts_down, layer.router):
        assert p.grad is not None and torch.isfinite(p.grad).all() and p.grad.abs().sum() > 0
