"""CUDA: the trainer equals the rollout bit for bit in bf16 with CUDA graphs on, also after update_weights (the graphs
replay over the same tensors); the stock-kernel trainer differs. The 1B-shaped numbers: samebits/benchmarks/rl.py."""
import pytest
import torch

from samebits.engine.llm import LLM
from samebits.models.synthetic import write_tiny_checkpoint
from samebits.rl.policy import Policy
from samebits.rl.rollout import completions_of, engine_logprobs
from samebits.runtime import deterministic_runtime
from tests.rl.conftest import SAMPLED, random_prompts

pytestmark = pytest.mark.gpu

SHAPE = {"hidden_size": 512, "intermediate_size": 1408, "vocab_size": 1024, "num_attention_heads": 8,
         "num_key_value_heads": 2, "torch_dtype": "bfloat16"}


def bits(values) -> list[int]:
    return torch.as_tensor(values, dtype=torch.float32).detach().cpu().view(torch.int32).tolist()


def test_cuda_rollout_equals_trainer_before_and_after_update(tmp_path):
    ckpt = str(write_tiny_checkpoint(tmp_path / "ckpt", "llama3", seed=2, **SHAPE))
    with deterministic_runtime():
        llm = LLM(model=ckpt, device="cuda", kv_cache_tokens=16384, cuda_graphs=True)
        assert llm.engine.runner.graphs is not None
        policy = Policy.from_pretrained(ckpt, device="cuda")
        prompts = random_prompts(24, seed=3)
        for round_ in range(2):
            completions, reported = completions_of(llm.generate(prompts, SAMPLED, use_tqdm=False))
            got = policy.logprobs(prompts, completions)
            assert [bits(a) for a in got] == [bits(b) for b in reported], round_
            sampled = policy.logprobs(prompts, completions, SAMPLED)
            engine = engine_logprobs(llm, prompts, completions, SAMPLED)
            assert [bits(a) for a in sampled] == [bits(b) for b in engine], round_
            # A training step, then the new weights into the running engine (graphs captured: copied in place).
            loss = -sum(lp.sum() for lp in got)
            loss.backward()
            with torch.no_grad():
                for p in policy.parameters():
                    p -= 1e-3 * p.grad
                    p.grad = None
            llm.update_weights(policy)
        fast = Policy.from_pretrained(ckpt, device="cuda", mode="fast")
        fast.load_state_dict(policy.state_dict())
        off = fast.logprobs(prompts, completions)
        assert sum(a != b for x, y in zip(off, got) for a, b in zip(bits(x), bits(y))) > 0
