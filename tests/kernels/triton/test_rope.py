"""The Triton RoPE against the torch op (kernels.rope.apply_rope): interpreter here, native on a GPU."""
from __future__ import annotations

import pytest
import torch

from samebits.kernels.rope import apply_rope
from samebits.models.rope_scaling import rope_cos_sin
from samebits.probe.compare import assert_same_bits
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


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_write_kv_gives_the_bits_of_rope_then_write_kv(dtype, seed):
    """The model's fused launch: the rotated q and both caches bit for bit those of rope then write_kv, from strided
    views of one qkv row, with a padding slot (-1) left untouched. Negative control: one token at another position
    is seen in q and in the key cache."""
    from samebits.kernels.triton.kv_write import write_kv

    g = fresh_generator(seed)
    qkv = rand((7, 8 + 2 + 2, 64), dtype, g, DEVICE)
    q, k, v = qkv[:, :8], qkv[:, 8:10], qkv[:, 10:]
    positions = torch.randint(0, 300, (7,), generator=g).to(DEVICE)
    slots = torch.tensor([5, 0, 17, -1, 9, 30, 2]).to(DEVICE)
    table = rope_cos_sin(64, 300, 10000.0, device=DEVICE)

    def caches():
        return (torch.full((4, 8, 2, 64), float("nan"), dtype=dtype, device=DEVICE),
                torch.full((4, 8, 2, 64), float("nan"), dtype=dtype, device=DEVICE))

    kc, vc = caches()
    q_want, k_rot = triton_rope.apply_rope(q, k, positions, table)
    write_kv(k_rot, v, kc, vc, slots)
    kc2, vc2 = caches()
    q_got = triton_rope.rope_write_kv(q, k, v, positions, table, kc2, vc2, slots)
    assert_same_bits(q_got, q_want, "rotated q")
    assert_same_bits(kc2, kc, "key cache (NaN where nothing was written)")
    assert_same_bits(vc2, vc, "value cache")
    moved = positions.clone()
    moved[4] += 1
    kc3, vc3 = caches()
    q_moved = triton_rope.rope_write_kv(q, k, v, moved, table, kc3, vc3, slots)
    assert not torch.equal(q_moved[4].view(torch.uint8), q_want[4].view(torch.uint8)), "the control moved no q bit"
    assert not torch.equal(kc3.view(torch.uint8), kc.view(torch.uint8)), "the control moved no cache bit"
