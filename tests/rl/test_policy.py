"""The trainer's logprobs are the rollout's bits: raw and sampling distribution, any batch order and micro-batch size,
from every source the engine loads; the stock-kernel trainer and transformers' own forward are the negative controls."""
import random

import pytest
import torch

from samebits.engine.llm import LLM
from samebits.models.synthetic import write_tiny_gguf
from samebits.rl.policy import Policy
from samebits.rl.rollout import completions_of, engine_logprobs
from samebits.runtime import deterministic_runtime
from tests.rl.conftest import ENGINE, SAMPLED, random_prompts


def bits(values) -> list[int]:
    return torch.as_tensor(values, dtype=torch.float32).detach().view(torch.int32).tolist()


def shuffled_microbatches(policy, prompts, completions, seed: int, params=None) -> list[torch.Tensor]:
    """Every sequence's logprobs, computed in a random order split into micro-batches of random sizes."""
    rng = random.Random(seed)
    order = list(range(len(prompts)))
    rng.shuffle(order)
    out = [None] * len(prompts)
    while order:
        size = rng.randint(1, 4)
        take, order = order[:size], order[size:]
        per = params if not isinstance(params, list) else [params[i] for i in take]
        with deterministic_runtime():
            got = policy.logprobs([prompts[i] for i in take], [completions[i] for i in take], per)
        for i, lp in zip(take, got):
            out[i] = lp
    return out


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_raw_logprobs_equal_generate_and_score_bitwise(policy, llm, rollouts, kind, seed):
    prompts, completions, reported, _ = rollouts[kind]
    scored = llm.score(prompts, completions)
    for trial in range(3):
        got = shuffled_microbatches(policy, prompts, completions, seed + trial)
        for lp, rep, sc in zip(got, reported, scored):
            assert bits(lp) == bits(rep) == bits(sc)


@pytest.mark.parametrize("kind", ["greedy", "sampled"])
def test_sampling_distribution_logprobs_equal_bitwise(policy, llm, rollouts, kind, seed):
    prompts, completions, _, params = rollouts[kind]
    engine = engine_logprobs(llm, prompts, completions, params)
    got = shuffled_microbatches(policy, prompts, completions, seed, params)
    for lp, ref in zip(got, engine):
        assert bits(lp) == bits(ref)
        # The sampler drew these tokens, so the distribution it drew from holds them.
        assert torch.isfinite(ref).all()
    if kind == "greedy":
        assert all(bits(ref) == bits([0.0] * len(ref)) for ref in engine)
    else:  # temperature and top-k/top-p moved the distribution: not the raw one
        raw = engine_logprobs(llm, prompts, completions)
        assert any(bits(a) != bits(b) for a, b in zip(raw, engine))


def test_per_sequence_sampling_params(policy, llm, rollouts):
    prompts, completions, _, _ = rollouts["sampled"]
    params = [rollouts["greedy"][3], rollouts["sampled"][3]] * 3
    engine = engine_logprobs(llm, prompts, completions, params)
    with deterministic_runtime():
        got = policy.logprobs(prompts, completions, params)
    assert [bits(a) for a in got] == [bits(b) for b in engine]


def test_negative_control_stock_kernel_trainer_differs(fast_policy, rollouts):
    """The same weights and the same autograd ops on the stock torch kernels: other bits."""
    prompts, completions, reported, _ = rollouts["sampled"]
    got = fast_policy.logprobs(prompts, completions)
    assert sum(a != b for lp, rep in zip(got, reported) for a, b in zip(bits(lp), bits(rep))) > 0


def test_negative_control_transformers_forward_differs(ckpt, rollouts):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32).eval()
    prompts, completions, reported, _ = rollouts["sampled"]
    differ = 0
    with torch.no_grad():
        for p, c, rep in zip(prompts, completions, reported):
            logits = hf(torch.tensor([p + c[:-1]])).logits[0, len(p) - 1:].float()
            lp = torch.log_softmax(logits, -1).gather(1, torch.tensor(c)[:, None])[:, 0]
            assert torch.allclose(lp, torch.tensor(rep), atol=1e-4)  # the same model...
            differ += sum(a != b for a, b in zip(bits(lp), bits(rep)))  # ...other bits
    assert differ > 0


def test_policy_from_transformers_module_equals_rollout(ckpt, rollouts):
    transformers = pytest.importorskip("transformers")
    hf = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    policy = Policy.from_hf(hf)
    prompts, completions, reported, _ = rollouts["sampled"]
    with deterministic_runtime():
        got = policy.logprobs(prompts, completions)
    assert [bits(a) for a in got] == [bits(b) for b in reported]


def test_policy_from_gguf_equals_its_engine(tmp_path):
    path = str(write_tiny_gguf(tmp_path / "tiny.gguf", "smollm2", seed=2, qtype="Q8_0"))
    llm = LLM(model=path, **ENGINE)
    prompts = [[t % 320 for t in p] for p in random_prompts(3, seed=5, hi=20)]  # the smollm2 variant's vocab
    completions, reported = completions_of(llm.generate(prompts, SAMPLED, use_tqdm=False))
    with deterministic_runtime():
        got = Policy.from_pretrained(path, device="cpu").logprobs(prompts, completions)
    assert [bits(a) for a in got] == [bits(b) for b in reported]


@pytest.mark.parametrize("prompts, completions, match", [
    ([[1, 2]], [[3], [4]], "1 prompts and 2 completions"),
    ([[]], [[3]], "non-empty"),
    ([[1, 2]], [[5000]], r"token ids must be ints in \[0, 1024\); got 5000"),
])
def test_bad_input_names_the_problem(policy, prompts, completions, match):
    with pytest.raises(ValueError, match=match):
        policy.logprobs(prompts, completions)
