"""The trainer's attention backward at real sizes on a GPU: lengths 1..3,000, GQA 1/4/8, head dims 64 and 128, bf16 and
fp16. Each sequence's gradient the same bits alone as in two packs, run to run; fp32 gradients within 2e-5 of the
dense form. Negative control: the atomic dQ variant differs run to run at these sizes."""
from __future__ import annotations

import random

import pytest
import torch

from samebits.kernels import grads as torch_grads
from samebits.kernels.triton.attention_bwd_atomic_demo import attention_bwd_atomic_dq
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.helpers import fresh_generator
from tests.kernels.triton.test_attention_bwd import make_seqs, packed

pytestmark = pytest.mark.gpu

CASES = [(128, 32, 8, torch.bfloat16), (64, 16, 16, torch.bfloat16), (128, 8, 1, torch.float16),
         (64, 32, 8, torch.bfloat16)]


def lengths(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [1, 2, 63, 64, 65, 127, 128, 129, 3000] + [rng.randint(1, 3000) for _ in range(5)]


@pytest.mark.parametrize("d,hq,hkv,dtype", CASES)
def test_sequence_gradients_are_the_same_bits_alone_and_packed(d, hq, hkv, dtype, seed):
    lens = lengths(seed)
    seqs = make_seqs(lens, hq, hkv, d, dtype, fresh_generator(seed))
    scale = d ** -0.5
    order = list(range(len(lens)))
    random.Random(seed).shuffle(order)
    first, _ = packed(seqs, list(range(len(lens))), scale)
    again, _ = packed(seqs, order, scale)
    for i, (a, b) in enumerate(zip(first, again)):
        alone = packed([seqs[i]], [0], scale)[0][0]
        for name, x, y, z in zip("qkv", a, b, alone):
            assert_same_bits(x, y, f"d{name} of sequence {i} (length {lens[i]}) in two packs")
            assert_same_bits(x, z, f"d{name} of sequence {i} (length {lens[i]}) alone")


@pytest.mark.parametrize("d", [64, 128])
def test_fp32_gradients_match_the_dense_form(d, seed):
    seqs = make_seqs([1, 100, 700, 1500], 8, 2, d, torch.float32, fresh_generator(seed))
    got, args = packed(seqs, [0, 1, 2, 3], d ** -0.5)
    want = torch_grads.attention_bwd(*args, d ** -0.5)
    for name, j, b in zip("qkv", range(3), want):
        a = torch.cat([g[j] for g in got])
        err = float((a - b).abs().max() / b.abs().max())
        assert err < 2e-5, f"d{name}: max |err| / max |ref| = {err:.2e}"


def test_atomic_dq_differs_run_to_run(seed):
    seqs = make_seqs([3000, 2000, 1000], 32, 8, 128, torch.bfloat16, fresh_generator(seed))
    _, args = packed(seqs, [0, 1, 2], 128 ** -0.5)
    first = attention_bwd_atomic_dq(*args, 128 ** -0.5)
    runs = [attention_bwd_atomic_dq(*args, 128 ** -0.5) for _ in range(4)]
    assert any(not mismatch(r[0], first[0]).same for r in runs), "atomic dQ gave the same bits in 5 runs"
    for r in runs:
        assert_same_bits(r[1], first[1], "dK takes no atomics")
