"""LLM.update_weights: in place, refused whole on bad input, the prefix cache dropped, the version in the fingerprint;
after it the rollout's logprobs are the synced trainer's bits."""
import pytest
import torch

from samebits.engine.llm import LLM
from samebits.engine.sampling_params import SamplingParams
from samebits.engine.weights import EngineBusy, WeightsError, plan
from samebits.models.synthetic import random_weights, write_tiny_checkpoint
from samebits.rl.policy import Policy
from samebits.rl.rollout import completions_of
from samebits.runtime import deterministic_runtime

ENGINE = {"device": "cpu", "kv_cache_tokens": 4096, "max_num_batched_tokens": 64}
SHAPE = {"hidden_size": 128, "intermediate_size": 256, "vocab_size": 320}
PARAMS = SamplingParams(temperature=0.8, seed=5, max_tokens=6, logprobs=0, ignore_eos=True)
# 40 tokens: two full 16-token blocks join the prefix cache after the first request.
PROMPTS = [[(7 * i + 3) % 300 + 3 for i in range(40)], [9, 8, 7, 6, 5]]


def bits(values) -> list[int]:
    return torch.as_tensor(values, dtype=torch.float32).detach().view(torch.int32).tolist()


def weight_bits(llm) -> dict:
    return {n: p.detach().clone() for n, p in llm.engine.runner.model.named_parameters()}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("w"), "llama3", seed=1, **SHAPE))


@pytest.fixture
def llm(ckpt):
    return LLM(model=ckpt, **ENGINE)


def nudged_policy(ckpt, seed: int) -> Policy:
    policy = Policy.from_pretrained(ckpt, device="cpu")
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in policy.parameters():
            p.add_(0.01 * torch.randn(p.shape, generator=gen))
    return policy


def rollout_vs_trainer(llm, policy) -> tuple[list, list, list]:
    outs = llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    completions, reported = completions_of(outs)
    with deterministic_runtime():
        trained = policy.logprobs(PROMPTS, completions)
    return outs, [bits(r) for r in reported], [bits(t) for t in trained]


def test_update_from_policy_in_place_then_rollout_equals_trainer(llm, ckpt, seed):
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)  # fills the prefix cache under the old weights
    before = llm.engine.fingerprint()["hash"]
    pointers = [p.data_ptr() for p in llm.engine.runner.model.parameters()]
    policy = nudged_policy(ckpt, seed)
    version = llm.update_weights(policy)
    assert [p.data_ptr() for p in llm.engine.runner.model.parameters()] == pointers
    fp = llm.engine.fingerprint()
    assert fp["weights"] == version and fp["hash"] != before
    outs, reported, trained = rollout_vs_trainer(llm, policy)
    assert reported == trained
    assert outs[0].num_cached_tokens == 0 and outs[0].fingerprint == fp["hash"]


def test_updating_to_the_loaded_weights_names_them_as_the_load_did(llm, ckpt, seed):
    loaded, before = llm.engine.loaded.weights, llm.engine.fingerprint()
    assert before["weights"] == loaded
    assert llm.update_weights(nudged_policy(ckpt, seed)) != loaded  # negative control: other weights, other digest
    assert llm.update_weights(Policy.from_pretrained(ckpt, device="cpu")) == loaded
    assert llm.engine.fingerprint()["hash"] == before["hash"]


def test_negative_control_without_dropping_the_prefix_cache(llm, ckpt, seed):
    """The same copy, but the old weights' cached KV kept: the cached prompt's rollout is no longer the trainer's."""
    llm.generate(PROMPTS, PARAMS, use_tqdm=False)
    policy = nudged_policy(ckpt, seed)
    with torch.no_grad():
        for dest, tensor in plan(llm.engine.runner.model, dict(policy.model.named_parameters())):
            dest.copy_(tensor)
    outs, reported, trained = rollout_vs_trainer(llm, policy)
    assert outs[0].num_cached_tokens == 32
    assert reported[0] != trained[0] and reported[1] == trained[1]


def test_update_from_hf_state_dict_and_transformers_module(llm, ckpt, tmp_path):
    other = random_weights(llm.engine.loaded.config, seed=9)
    llm.update_weights(other, version="step-1")
    assert llm.engine.fingerprint()["weights"] == "step-1"
    fresh = Policy.from_pretrained(write_tiny_checkpoint(tmp_path / "other", "llama3", seed=9, **SHAPE), device="cpu")
    _, reported, trained = rollout_vs_trainer(llm, fresh)
    assert reported == trained
    transformers = pytest.importorskip("transformers")
    back = transformers.AutoModelForCausalLM.from_pretrained(ckpt, dtype=torch.float32)
    llm.update_weights(back)
    original = Policy.from_pretrained(ckpt, device="cpu")
    _, reported, trained = rollout_vs_trainer(llm, original)
    assert reported == trained


def _bad_inputs(good: dict) -> dict:
    name = "model.layers.0.self_attn.q_proj.weight"
    return {
        "shape": ({**good, name: good[name][:-1]}, name + r" has shape \(127, 128\), the model holds \(128, 128\)"),
        "dtype": ({**good, name: good[name].double()}, name + " is torch.float64, the model holds torch.float32"),
        "missing": ({k: v for k, v in good.items() if k != name}, "missing " + name),
        "unexpected": ({**good, "model.layers.9.mlp.up_proj.weight": good[name]}, "unexpected model.layers.9"),
        "not a tensor": ({**good, name: [0.0]}, name + " is a list, not a tensor"),
    }


@pytest.mark.parametrize("case", ["shape", "dtype", "missing", "unexpected", "not a tensor"])
def test_bad_input_is_refused_whole(llm, case):
    good = random_weights(llm.engine.loaded.config, seed=3)
    # The first tensors in the mapping are fine: a partial copy would already have changed them.
    bad, match = _bad_inputs(good)[case]
    before, fp = weight_bits(llm), llm.engine.fingerprint()
    with pytest.raises(WeightsError, match=match):
        llm.update_weights(bad)
    after = weight_bits(llm)
    assert all(torch.equal(before[n].view(torch.int32), after[n].view(torch.int32)) for n in before)
    assert llm.engine.fingerprint() == fp


def test_busy_engine_is_refused(llm):
    llm.engine.add_request("r", [5, 6, 7], PARAMS)
    with pytest.raises(EngineBusy, match="requests are in flight"):
        llm.update_weights(random_weights(llm.engine.loaded.config, seed=3))
    llm.engine.abort_request("r")


def test_unknown_source_type_is_refused(llm):
    with pytest.raises(TypeError, match="expected a mapping of tensors or a torch module, got int"):
        llm.update_weights(3)


def test_tensor_parallel_engine_is_refused(llm, monkeypatch):
    """A sharded engine's runner holds rank 0's shard only: refused whole, before any copy."""
    before = {n: p.clone() for n, p in llm.engine.runner.model.named_parameters()}
    monkeypatch.setattr(llm.engine, "config", llm.engine.config.replace(tensor_parallel_size=2))
    with pytest.raises(WeightsError, match="tensor_parallel_size=2 is not supported yet"):
        llm.update_weights(random_weights(llm.engine.loaded.config, seed=3))
    assert all(torch.equal(p, before[n]) for n, p in llm.engine.runner.model.named_parameters())
