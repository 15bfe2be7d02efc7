"""Mixture-of-experts models: checkpoints transformers writes (Qwen3-MoE sharded, Mixtral, Qwen2-MoE with its shared
expert and a dense layer) match transformers' forward within the dense models' bound in both modes, greedy tokens
equal; MoE features we do not implement are refused by the key that asks for them."""
import pytest
import torch

from samebits.distributed import shard as sh
from samebits.kernels import get_ops
from samebits.models.config import ModelConfig, UnsupportedModelError
from samebits.models.loader_hf import load_hf_dir
from samebits.models.synthetic import tiny_hf_config
from tests.models.helpers import greedy, prefill_logits
from tests.models.test_tiny_vs_transformers import PROMPTS, _assert_close, _reference_logits, _transformers_checkpoint

transformers = pytest.importorskip("transformers")
CASES = {"qwen3_moe-sharded": ("qwen3_moe", True), "mixtral": ("mixtral", False), "qwen2_moe": ("qwen2_moe", False)}


@pytest.mark.parametrize("case", sorted(CASES))
def test_transformers_checkpoint_matches_in_both_modes(tmp_path, case):
    variant, sharded = CASES[case]
    ref_model = _transformers_checkpoint(tmp_path, variant, {}, sharded)
    for mode in ("fast", "deterministic"):  # greedy below on the last: deterministic
        model, tok, cfg = load_hf_dir(tmp_path, get_ops(mode, "cpu"), torch.float32)
        assert cfg.moe is not None and cfg.moe.num_experts == 4
        prompts = [tok.encode(p) for p in PROMPTS[:4]]
        _assert_close(prefill_logits(model, prompts), _reference_logits(ref_model, prompts))
    prompt = prompts[0]
    with torch.no_grad():
        hf = ref_model.generate(torch.tensor([prompt]), max_new_tokens=8, do_sample=False, eos_token_id=None)
    assert greedy(model, prompt, 8, set()) == hf[0, len(prompt):].tolist()


def test_transformers_module_weights_load_too():
    """A transformers 5 module's state_dict holds each layer's experts fused ([E, 2I, H] and [E, H, I])."""
    from samebits.models.registry import build_model

    hf = tiny_hf_config("qwen3_moe")
    ref = transformers.AutoModelForCausalLM.from_config(transformers.AutoConfig.for_model(**hf), dtype=torch.float32)
    model = build_model(ModelConfig.from_hf(hf), get_ops("fast", "cpu"))
    model.load_weights(ref.state_dict().items())
    gate_up = ref.state_dict()["model.layers.1.mlp.experts.gate_up_proj"]
    assert torch.equal(model.layers[1].experts_gate_up, gate_up)


def test_config_reads_each_family():
    q3 = ModelConfig.from_hf(tiny_hf_config("qwen3_moe", num_experts=128, num_experts_per_tok=8))
    assert (q3.moe.num_experts, q3.moe.top_k, q3.moe.norm_topk_prob, q3.qk_norm) == (128, 8, True, True)
    mixtral = ModelConfig.from_hf(tiny_hf_config("mixtral"))
    assert (mixtral.moe.intermediate_size, mixtral.moe.norm_topk_prob, mixtral.qkv_bias) == (96, True, False)
    q2 = ModelConfig.from_hf(tiny_hf_config("qwen2_moe"))
    assert (q2.moe.shared_expert_intermediate_size, q2.moe.dense_layers, q2.qkv_bias) == (96, (1,), True)
    step = ModelConfig.from_hf(tiny_hf_config("qwen2_moe", num_hidden_layers=4, mlp_only_layers=[],
                                              decoder_sparse_step=2))
    assert step.moe.dense_layers == (0, 2)  # HF: sparse where (i + 1) % decoder_sparse_step == 0


@pytest.mark.parametrize("change,named", [
    ({"scoring_func": "sigmoid"}, "scoring_func"),
    ({"topk_method": "noaux_tc"}, "topk_method"),
    ({"n_group": 8}, "n_group"),
    ({"routed_scaling_factor": 2.5}, "routed_scaling_factor"),
    ({"ep_size": 4}, "ep_size"),
    ({"n_shared_experts": 1}, "n_shared_experts"),
])
def test_unsupported_moe_features_are_named(change, named):
    with pytest.raises(UnsupportedModelError, match=named):
        ModelConfig.from_hf({**tiny_hf_config("qwen3_moe"), **change})


def test_invalid_moe_shapes_are_named():
    with pytest.raises(ValueError, match="num_experts_per_tok"):
        ModelConfig.from_hf(tiny_hf_config("qwen3_moe", num_experts_per_tok=5))
    with pytest.raises(UnsupportedModelError, match="expert_gating_func"):
        ModelConfig.from_gguf({"general.architecture": "qwen3moe", "qwen3moe.attention.head_count": 4,
                               "qwen3moe.embedding_length": 64, "qwen3moe.expert_count": 4,
                               "qwen3moe.expert_used_count": 2, "qwen3moe.expert_gating_func": 2}, 320, True)


@pytest.mark.parametrize("invariant,world", [(False, 2), (True, 1)])
def test_tensor_and_expert_parallel_moe_is_refused_by_name(invariant, world):
    cfg = ModelConfig.from_hf(tiny_hf_config("mixtral"))
    with pytest.raises(ValueError, match="tensor_parallel_size=2" if world == 2 else "all_reduce='invariant'"):
        sh.check_divisible(cfg, sh.Shard(0, world, invariant))


@pytest.mark.parametrize("variant", ["mixtral", "qwen2_moe"])
def test_gguf_experts_load_as_the_folder_does(tmp_path, variant):
    """F32 GGUF (stacked ffn_*_exps, Mixtral's Q/K permuted as llama.cpp writes it) vs the HF folder of the same
    weights: the same config and the same logits, bit for bit."""
    from samebits.models.loader_gguf import load_gguf
    from samebits.models.synthetic import write_tiny_checkpoint, write_tiny_gguf

    kw = {"mlp_only_layers": []} if variant == "qwen2_moe" else {}  # llama.cpp's qwen2moe has no dense layers
    ops = get_ops("deterministic", "cpu")
    from_gguf, tok, gguf_cfg = load_gguf(write_tiny_gguf(tmp_path / "m.gguf", variant, 1, "F32", **kw), ops,
                                         torch.float32)
    from_dir, _, dir_cfg = load_hf_dir(write_tiny_checkpoint(tmp_path / "hf", variant, 1, **kw), ops, torch.float32)
    assert gguf_cfg.moe == dir_cfg.moe and gguf_cfg.architecture == variant
    prompts = [tok.encode(p) for p in PROMPTS[:3]]
    for a, b in zip(prefill_logits(from_gguf, prompts), prefill_logits(from_dir, prompts)):
        assert torch.equal(a, b)


def test_qwen3moe_gguf_matches_transformers_gguf(tmp_path):
    # transformers' GGUF mapping reads neither expert_feed_forward_length nor a head_dim but its defaults' (768, 128).
    from samebits.models.loader_gguf import load_gguf
    from samebits.models.synthetic import write_tiny_gguf

    path = write_tiny_gguf(tmp_path / "q.gguf", "qwen3_moe", 1, "Q8_0", head_dim=128, moe_intermediate_size=768)
    ref = transformers.AutoModelForCausalLM.from_pretrained(tmp_path, gguf_file=path.name, dtype=torch.float32).eval()
    model, tok, _ = load_gguf(path, get_ops("deterministic", "cpu"), torch.float32)
    prompts = [tok.encode(p) for p in PROMPTS[:3]]
    _assert_close(prefill_logits(model, prompts), _reference_logits(ref, prompts))


def test_fp8_of_a_mixture_is_refused_by_name(tmp_path):
    from samebits.models.synthetic import write_tiny_checkpoint

    path = write_tiny_checkpoint(tmp_path, "qwen3_moe")
    with pytest.raises(UnsupportedModelError, match="FP8 .* mixture of experts"):
        load_hf_dir(path, get_ops("fast", "cpu"), torch.float32, quantization="fp8")
