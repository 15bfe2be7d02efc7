"""The Triton RoPE against the torch op (kernels.rope.apply_rope): interpreter here, native on a GPU."""
from __future__ import annotations

import pytest
import torch

from samebits.diagnostics.compare import assert_same_bits
from samebits.kernels.rope import apply_rope
from samebits.models.rope_scaling import rope_cos_sin
from tests.kernels.helpers import fresh_generator, rand

pytestmark = pytest.mark.interpreter
triton_rope = pytest.importorskip("samebits.kernels.triton.rope")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_rope_kernel_close_to_reference_and_batch_invariant(seed):
    g = fresh_generator(seed)
    q, k = rand((12, 6, 128), torch.bfloat16, g, DEVICE), rand((12, 2, 128), torch.bfloat16, g, DEVICE)
    positions = torch.randint(0, 4000, (12,), generator=g).to(DEVICE)
    table = rope_cos_sin(128, 4000, 500000.0, device=DEVICE)
    q_out, k_out = triton_rope.apply_rope(q, k, positions, table)
    q_ref, k_ref = apply_rope(q, k, positions, table)
    torch.testing.assert_close(q_out.float(), q_ref.float(), rtol=8e-3, atol=8e-3)
    torch.testing.assert_close(k_out.float(), k_ref.float(), rtol=8e-3, atol=8e-3)
    q_part, k_part = triton_rope.apply_rope(q[5:6], k[5:6], positions[5:6], table)
    assert_same_bits(q_part, q_out[5:6], "rope q row alone vs batched")
    assert_same_bits(k_part, k_out[5:6], "rope k row alone vs batched")


def test_one_launch_rotates_strided_q_and_k_with_the_torch_ops_bits(seed):
    """q and k as the model passes them (strided views of one qkv row), rotated in one launch: in float32, where
    neither side rounds at the end, every bit of the torch op's (same products and sums, no fma either side)."""
    g = fresh_generator(seed)
    qkv = rand((9, 6 + 2 + 2, 64), torch.float32, g, DEVICE)
    q, k = qkv[:, :6], qkv[:, 6:8]
    positions = torch.randint(0, 300, (9,), generator=g).to(DEVICE)
    table = rope_cos_sin(64, 300, 10000.0, device=DEVICE)
    for got, want, name in zip(triton_rope.apply_rope(q, k, positions, table), apply_rope(q, k, positions, table),
                               ("q", "k")):
        assert_same_bits(got, want, f"rope {name}: one launch vs the torch op")
