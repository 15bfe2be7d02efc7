"""The fused race kernel equals its torch reference (kernels/race.py) bit for bit: tokens and winning keys (interpreter
here; the H200 run in tests/kernels/test_gpu.py holds it to the reference on CUDA at a real vocabulary)."""
import pytest
import torch

from samebits.kernels.race import gumbel_race as reference
from samebits.kernels.triton.race import VOCAB_CHUNK, gumbel_race

pytestmark = pytest.mark.interpreter
SEED = 20261201


def counters(rows: int, g: torch.Generator):
    return (torch.randint(-2**63, 2**63 - 1, (rows,), dtype=torch.int64, generator=g),
            torch.randint(0, 2**32, (rows,), dtype=torch.int64, generator=g),
            torch.randint(0, 2**32, (rows,), dtype=torch.int64, generator=g))


def assert_same(got, want):
    """Tokens bit for bit; keys to the ulp: the interpreter's float64 log is numpy's, the reference's torch's, and the
    two differ in the last bit now and then (on CUDA both are the device's, and the GPU test asks for every bit)."""
    assert torch.equal(got[0], want[0]), "tokens differ"
    ulps = (got[1].view(torch.int64) - want[1].view(torch.int64)).abs()
    assert int(ulps.max()) <= 1, f"winning keys differ by {int(ulps.max())} ulps"


@pytest.mark.parametrize("vocab", [1, 5, 4099, VOCAB_CHUNK + 1])
def test_kernel_equals_reference(vocab):
    g = torch.Generator().manual_seed(SEED + vocab)
    z = torch.randn(5, vocab, generator=g) * torch.tensor([[0.1], [1.0], [4.0], [30.0], [1.0]])
    z[4, torch.randperm(vocab, generator=g)[: vocab // 2]] = float("-inf")  # a filtered row
    seeds, samples, positions = counters(5, g)
    assert_same(gumbel_race(z, seeds, samples, positions, 0), reference(z, seeds, samples, positions, 0))


def test_ties_nan_and_empty_rows_follow_argmax():
    vocab = VOCAB_CHUNK + 40
    z = torch.zeros(3, vocab)
    z[0] = float("-inf")  # nothing drawable: argmax's first index
    z[1, [7, VOCAB_CHUNK + 3]] = float("nan")  # NaN wins, the first one
    z[2, :] = float("-inf")
    z[2, VOCAB_CHUNK + 5] = 0.0  # the one token left, in the second chunk
    seeds, samples, positions = (torch.tensor([1, 2, 3]), torch.zeros(3, dtype=torch.int64),
                                 torch.zeros(3, dtype=torch.int64))
    got, want = gumbel_race(z, seeds, samples, positions, 0), reference(z, seeds, samples, positions, 0)
    assert want[0].tolist() == [0, 7, VOCAB_CHUNK + 5]
    assert torch.equal(got[0], want[0])


def test_negative_control_another_stream_draws_other_tokens():
    g = torch.Generator().manual_seed(SEED)
    z = torch.zeros(4, 64)
    seeds, samples, positions = counters(4, g)
    assert not torch.equal(gumbel_race(z, seeds, samples, positions, 0)[0],
                           gumbel_race(z, seeds, samples, positions, 1)[0])


def test_launcher_names_what_is_wrong():
    idx = torch.zeros(2, dtype=torch.int64)
    with pytest.raises(AssertionError, match="z must be"):
        gumbel_race(torch.zeros(2, 8, dtype=torch.float64), idx, idx, idx, 0)
    with pytest.raises(AssertionError, match="sample_indices must be int64"):
        gumbel_race(torch.zeros(2, 8), idx, idx.int(), idx, 0)
