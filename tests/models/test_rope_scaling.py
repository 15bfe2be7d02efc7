"""The RoPE table of an HF config against HF's Llama rotary embedding (default and llama3 scaling)."""
from __future__ import annotations

import pytest
import torch

from samebits.models.rope_scaling import rope_cos_sin, scaled_inv_freq
from samebits.probe.compare import assert_same_bits

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


def hf_cos_sin(head_dim, theta, scaling, positions):
    transformers = pytest.importorskip("transformers")
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    params = {"rope_type": "default", **(scaling or {}), "rope_theta": theta}
    cfg = transformers.LlamaConfig(hidden_size=2 * head_dim, num_attention_heads=2, head_dim=head_dim,
                                   max_position_embeddings=131072, rope_parameters=params)
    emb = LlamaRotaryEmbedding(cfg)
    cos, sin = emb(torch.zeros(1, 1, head_dim), positions[None])
    return emb.inv_freq, cos[0], sin[0]


@pytest.mark.parametrize("head_dim,theta,scaling", [(64, 10000.0, None), (128, 500000.0, LLAMA3)])
def test_table_matches_hf(head_dim, theta, scaling):
    positions = torch.tensor([0, 1, 2, 17, 1000, 8191, 8192, 65535, 131071])
    inv_freq, cos, sin = hf_cos_sin(head_dim, theta, scaling, positions)
    table = rope_cos_sin(head_dim, 131072, theta, scaling)
    assert table.shape == (131072, head_dim) and table.dtype == torch.float32
    half = head_dim // 2
    # HF duplicates each half (cat(freqs, freqs)); ours stores cos | sin once each.
    torch.testing.assert_close(table[positions, :half], cos[:, :half], rtol=0, atol=2e-6)
    torch.testing.assert_close(table[positions, half:], sin[:, :half], rtol=0, atol=2e-6)
    assert_same_bits(scaled_inv_freq(head_dim, theta, scaling), inv_freq.float(), "inv_freq vs HF")


def test_llama3_scaling_changes_only_low_frequencies():
    plain, scaled = rope_cos_sin(128, 64, 500000.0, None), rope_cos_sin(128, 64, 500000.0, LLAMA3)
    assert torch.equal(plain[:, 0], scaled[:, 0])  # highest frequency untouched
    assert not torch.equal(plain[:, 127], scaled[:, 127])  # lowest frequency (its sin) divided by `factor`


def test_unknown_scaling_fails_loud():
    with pytest.raises(NotImplementedError, match="yarn"):
        rope_cos_sin(64, 10, 10000.0, {"rope_type": "yarn", "factor": 4.0})
