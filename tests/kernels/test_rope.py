"""RoPE: the table against HF's Llama rotary embedding (default and llama3 scaling), and the rotation itself."""
from __future__ import annotations

import pytest
import torch

from samebits.diagnostics.compare import assert_same_bits
from samebits.kernels.rope import apply_rope, apply_rope_reference, rope_cos_sin

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
    from samebits.kernels.rope import _scaled_inv_freq

    assert_same_bits(_scaled_inv_freq(head_dim, theta, scaling), inv_freq.float(), "inv_freq vs HF")


def test_llama3_scaling_changes_only_low_frequencies():
    plain, scaled = rope_cos_sin(128, 64, 500000.0, None), rope_cos_sin(128, 64, 500000.0, LLAMA3)
    assert torch.equal(plain[:, 0], scaled[:, 0])  # highest frequency untouched
    assert not torch.equal(plain[:, 127], scaled[:, 127])  # lowest frequency (its sin) divided by `factor`


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_apply_matches_hf_rotate_half(dtype):
    transformers = pytest.importorskip("transformers")  # noqa: F841
    from transformers.models.llama.modeling_llama import apply_rotary_pos_emb

    gen = torch.Generator().manual_seed(0)
    t, hq, hkv, d = 37, 8, 2, 128
    q = torch.randn(t, hq, d, generator=gen).to(dtype)
    k = torch.randn(t, hkv, d, generator=gen).to(dtype)
    positions = torch.randint(0, 5000, (t,), generator=gen)
    table = rope_cos_sin(d, 5000, 500000.0, LLAMA3)
    q_out, k_out = apply_rope(q, k, positions, table)
    cos = torch.cat([table[positions, :d // 2]] * 2, -1)[None]
    sin = torch.cat([table[positions, d // 2:]] * 2, -1)[None]
    q_ref, k_ref = apply_rotary_pos_emb(q.double().transpose(0, 1)[None], k.double().transpose(0, 1)[None],
                                        cos.double(), sin.double())
    tol = {torch.float32: 1e-6, torch.bfloat16: 8e-3, torch.float16: 1e-3}[dtype]
    torch.testing.assert_close(q_out.double(), q_ref[0].transpose(0, 1), rtol=tol, atol=tol)
    torch.testing.assert_close(k_out.double(), k_ref[0].transpose(0, 1), rtol=tol, atol=tol)
    assert q_out.dtype == dtype


def test_rotation_of_a_token_is_independent_of_the_batch():
    gen = torch.Generator().manual_seed(1)
    q, k = torch.randn(50, 4, 64, generator=gen).bfloat16(), torch.randn(50, 2, 64, generator=gen).bfloat16()
    positions = torch.randint(0, 300, (50,), generator=gen)
    table = rope_cos_sin(64, 300, 10000.0)
    q_all, k_all = apply_rope(q, k, positions, table)
    for lo, hi in [(0, 1), (7, 8), (10, 33), (49, 50)]:
        q_part, k_part = apply_rope(q[lo:hi], k[lo:hi], positions[lo:hi], table)
        assert_same_bits(q_part, q_all[lo:hi], f"q rows {lo}:{hi}")
        assert_same_bits(k_part, k_all[lo:hi], f"k rows {lo}:{hi}")


def test_unknown_scaling_fails_loud():
    with pytest.raises(NotImplementedError, match="yarn"):
        rope_cos_sin(64, 10, 10000.0, {"rope_type": "yarn", "factor": 4.0})
    with pytest.raises(ValueError, match="cos_sin"):
        apply_rope(torch.zeros(2, 2, 64), torch.zeros(2, 2, 64), torch.zeros(2, dtype=torch.long),
                   torch.zeros(10, 32))


def test_reference_is_the_cpu_path():
    gen = torch.Generator().manual_seed(2)
    q, k = torch.randn(9, 4, 64, generator=gen), torch.randn(9, 4, 64, generator=gen)
    positions = torch.arange(9)
    table = rope_cos_sin(64, 9, 10000.0)
    for a, b in zip(apply_rope(q, k, positions, table), apply_rope_reference(q, k, positions, table)):
        assert_same_bits(a, b, "apply_rope on CPU")
