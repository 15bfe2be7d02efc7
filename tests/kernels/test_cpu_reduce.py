"""kernels/cpu/reduce.py: the halving tree's sums are close to float64, a function of the row alone, and unchanged by
zero padding; the same checks catch a sum whose order follows the row's length."""
import pytest
import torch

from samebits.kernels.cpu.reduce import tree_sum
from samebits.probe.compare import assert_same_bits
from tests.kernels.helpers import check_row_invariance, fresh_generator, rand


@pytest.mark.parametrize("n", [1, 2, 3, 576, 1000, 49152])
def test_close_to_float64(n, seed):
    g = fresh_generator(seed)
    x = rand((7, n), torch.float32, g, scale=3.0)
    ref = x.double().sum(-1)
    assert ((tree_sum(x).double() - ref).abs() <= 1e-6 * x.double().abs().sum(-1) + 1e-30).all()


def test_empty_rows_sum_to_zero():
    assert torch.equal(tree_sum(torch.zeros(3, 0)), torch.zeros(3))


@pytest.mark.parametrize("n", [5, 576, 1000])
def test_row_alone_equals_row_in_batch(n, seed):
    g = fresh_generator(seed)
    row = rand((n,), torch.float32, g, scale=100.0)
    check_row_invariance(lambda x: tree_sum(x)[:, None], row, lambda m: rand((m, n), torch.float32, g, scale=100.0),
                         [2, 3, 17, 64, 257], g, f"tree_sum n={n}")


def _pad(x, extra):
    return torch.cat([x, x.new_zeros(x.shape[0], extra)], dim=-1)


@pytest.mark.parametrize("n", [5, 100, 576, 1000])
def test_zero_padding_never_changes_the_sum(n, seed):
    g = fresh_generator(seed)
    x = rand((16, n), torch.float32, g, scale=100.0)
    for extra in [1, 3, 27, n, 5 * n + 11]:
        assert_same_bits(tree_sum(_pad(x, extra)), tree_sum(x), f"n={n} padded by {extra}")


def _length_dependent_sum(x):
    # Deliberately wrong: halves split at the middle of the (padded) length, so padding moves the split.
    cut = x.shape[-1] // 2
    return x[:, :cut].sum(-1) + x[:, cut:].sum(-1)


def test_negative_control_length_dependent_sum_is_caught(seed):
    g = fresh_generator(seed)
    x = rand((64, 1000), torch.float32, g, scale=100.0)
    differ = [e for e in (1, 3, 27, 500) if not torch.equal(_length_dependent_sum(_pad(x, e)),
                                                           _length_dependent_sum(x))]
    assert differ, "padding a length-dependent sum never changed its bits"
