"""One tiny checkpoint, engine and rollout batch for the RL tests (an engine's load proves its GEMM routes: seconds)."""
import random

import pytest

from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
from samebits.models.synthetic import write_tiny_checkpoint
from samebits.rl.policy import Policy
from samebits.rl.rollout import completions_of

# tests/engine/test_invariance.py's CPU shape: wide enough that the vendor matmuls change their blocking with M.
SHAPE = {"hidden_size": 256, "intermediate_size": 512, "vocab_size": 1024, "num_attention_heads": 4,
         "num_key_value_heads": 2}
ENGINE = {"device": "cpu", "kv_cache_tokens": 8192, "max_num_batched_tokens": 64}
SAMPLED = SamplingParams(temperature=0.9, top_p=0.8, top_k=200, seed=3, max_tokens=8, logprobs=0, ignore_eos=True)
GREEDY = SamplingParams(temperature=0.0, max_tokens=8, logprobs=0, ignore_eos=True)


def random_prompts(n: int, seed: int, lo: int = 3, hi: int = 70) -> list[list[int]]:
    rng = random.Random(seed)
    return [[rng.randrange(3, SHAPE["vocab_size"]) for _ in range(rng.randint(lo, hi))] for _ in range(n)]


@pytest.fixture(scope="session")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("rl-tiny"), "llama3", seed=1, **SHAPE))


@pytest.fixture(scope="session")
def llm(ckpt):
    return LLM(model=ckpt, **ENGINE)


@pytest.fixture(scope="session")
def rollouts(llm):
    """{params name: (prompts, completions, reported logprobs, params)}: 6 prompts (some longer than one engine
    chunk of 64 tokens), greedy and sampled with top-k and top-p."""
    prompts = random_prompts(6, seed=11)
    out = {}
    for name, params in (("greedy", GREEDY), ("sampled", SAMPLED)):
        tokens, logprobs = completions_of(llm.generate(prompts, params, use_tqdm=False))
        out[name] = (prompts, tokens, logprobs, params)
    return out


@pytest.fixture(scope="session")
def policy(ckpt):
    """The trainer on the engine's checkpoint (tests compute with it and may leave gradients, never change weights)."""
    return Policy.from_pretrained(ckpt, device="cpu")


@pytest.fixture(scope="session")
def fast_policy(ckpt):
    """The same weights on the stock torch kernels: the negative control."""
    return Policy.from_pretrained(ckpt, device="cpu", mode="fast")
