"""RoPE: the rotation (kernels.rope.apply_rope) against HF's rotate_half, and its batch invariance."""
from __future__ import annotations

import pytest
import torch

from samebits.kernels import get_ops
from samebits.kernels.rope import apply_rope
from samebits.models.rope_scaling import rope_cos_sin
from samebits.modes import MODES
from samebits.probe.compare import assert_same_bits
from tests.kernels.helpers import fresh_generator, rand

LLAMA3 = {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
          "original_max_position_embeddings": 8192}


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


def test_a_wrong_table_fails_loud():
    with pytest.raises(ValueError, match="cos_sin"):
        apply_rope(torch.zeros(2, 2, 64), torch.zeros(2, 2, 64), torch.zeros(2, dtype=torch.long),
                   torch.zeros(10, 32))


@pytest.mark.parametrize("mode", MODES)
def test_the_cpu_backends_rotate_through_the_reference(mode, seed):
    g = fresh_generator(seed)
    q, k = rand((9, 4, 64), torch.float32, g), rand((9, 4, 64), torch.float32, g)
    positions = torch.arange(9)
    table = rope_cos_sin(64, 9, 10000.0)
    for a, b in zip(get_ops(mode, "cpu").rope(q, k, positions, table), apply_rope(q, k, positions, table)):
        assert_same_bits(a, b, f"{mode} rope on CPU")
