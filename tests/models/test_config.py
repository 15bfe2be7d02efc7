"""ModelConfig: what each family's config.json turns into, and what is refused by name."""
import dataclasses

import pytest

from samebits.models.config import ModelConfig, UnsupportedModelError
from samebits.models.synthetic import tiny_hf_config


def test_each_variant_maps_its_features():
    llama3 = ModelConfig.from_hf(tiny_hf_config("llama3"))
    assert llama3.rope_scaling["rope_type"] == "llama3" and llama3.rope_theta == 500000.0
    assert not (llama3.qkv_bias or llama3.qk_norm or llama3.tie_word_embeddings)
    qwen2 = ModelConfig.from_hf(tiny_hf_config("qwen2"))
    assert qwen2.qkv_bias and not qwen2.o_bias
    qwen3 = ModelConfig.from_hf(tiny_hf_config("qwen3"))
    assert qwen3.qk_norm and qwen3.head_dim == 64 and qwen3.q_size == 256 != qwen3.hidden_size
    assert ModelConfig.from_hf(tiny_hf_config("smollm2")).tie_word_embeddings
    assert ModelConfig.from_hf(tiny_hf_config("llama3", attention_bias=True)).o_bias


def test_transformers5_rope_parameters_form_is_the_same_config():
    old = tiny_hf_config("llama3")
    new = {k: v for k, v in old.items() if k not in ("rope_theta", "rope_scaling")}
    new["rope_parameters"] = {"rope_theta": old["rope_theta"], **old["rope_scaling"]}
    assert ModelConfig.from_hf(new) == ModelConfig.from_hf(old)
    plain = {**new, "rope_parameters": {"rope_type": "default", "rope_theta": 1e4}}
    assert ModelConfig.from_hf(plain).rope_scaling is None


def test_sliding_window_caps_the_context():
    cfg = ModelConfig.from_hf(tiny_hf_config("mistral", sliding_window=128))
    assert cfg.max_position_embeddings == 128
    assert ModelConfig.from_hf(tiny_hf_config("qwen2", sliding_window=128)).max_position_embeddings == 512


@pytest.mark.parametrize("change,named", [
    ({"model_type": "gemma2", "architectures": ["Gemma2ForCausalLM"]}, "gemma2"),
    ({"architectures": ["LlamaForSequenceClassification"]}, "LlamaForSequenceClassification"),
    ({"rope_scaling": {"rope_type": "yarn", "factor": 4.0}}, "yarn"),
    ({"hidden_act": "gelu"}, "gelu"),
    ({"mlp_bias": True}, "mlp_bias"),
    ({"quantization_config": {"quant_method": "awq"}}, "awq"),
])
def test_unsupported_architectures_and_features_are_named(change, named):
    with pytest.raises(UnsupportedModelError, match=named):
        ModelConfig.from_hf({**tiny_hf_config("llama3"), **change})


def test_invalid_shapes_are_rejected():
    base = ModelConfig.from_hf(tiny_hf_config("llama3"))
    with pytest.raises(ValueError, match="num_kv_heads"):
        dataclasses.replace(base, num_kv_heads=3)
    with pytest.raises(ValueError, match="hidden_size"):
        dataclasses.replace(base, hidden_size=0)
    with pytest.raises(ValueError, match="even"):
        dataclasses.replace(base, head_dim=15)
    with pytest.raises(dataclasses.FrozenInstanceError):
        base.hidden_size = 1


def test_from_gguf_metadata():
    meta = {"general.architecture": "qwen2", "qwen2.attention.head_count": 4, "qwen2.embedding_length": 64,
            "qwen2.feed_forward_length": 128, "qwen2.block_count": 2, "qwen2.attention.head_count_kv": 2,
            "qwen2.context_length": 512, "qwen2.attention.layer_norm_rms_epsilon": 1e-6, "qwen2.rope.freq_base": 1e6,
            "tokenizer.ggml.eos_token_id": 7}
    cfg = ModelConfig.from_gguf(meta, vocab_size=320, tied=True)
    assert (cfg.qkv_bias, cfg.head_dim, cfg.eos_token_ids, cfg.tie_word_embeddings) == (True, 16, (7,), True)
    with pytest.raises(UnsupportedModelError, match="gemma"):
        ModelConfig.from_gguf({**meta, "general.architecture": "gemma"}, vocab_size=320, tied=True)
    with pytest.raises(UnsupportedModelError, match="yarn"):
        ModelConfig.from_gguf({**meta, "qwen2.rope.scaling.type": "yarn"}, vocab_size=320, tied=True)
    with pytest.raises(UnsupportedModelError, match="partial rotary"):
        ModelConfig.from_gguf({**meta, "qwen2.rope.dimension_count": 8}, vocab_size=320, tied=True)
