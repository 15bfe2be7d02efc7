"""linear_partials: the K-chunk float32 partial sums that TP-invariant mode merges (samebits/distributed/reduce.py).

Each chunk is a proven GEMM of its own, so chunk i's bits do not depend on the row count (batch invariance) nor on
which other chunks are computed beside it; the deterministic CPU backend and the Triton kernel (interpreted here) are
checked against the torch reference (vendor.py) and float64."""
import pytest
import torch

from samebits.kernels import get_ops, vendor
from tests.kernels.helpers import DTYPES, assert_close_to_ref, fresh_generator, rand

CPU = get_ops("deterministic", "cpu")


def _data(m, chunks, n, kc, dtype, g):
    return rand((m, chunks * kc), dtype, g), rand((chunks, n, kc), dtype, g, scale=(chunks * kc) ** -0.5)


def _ref64(x, w):
    c, _, kc = w.shape
    return torch.stack([x[:, i * kc:(i + 1) * kc].double() @ w[i].double().t() for i in range(c)])


@pytest.mark.parametrize("dtype", DTYPES)
def test_cpu_matches_float64_and_the_torch_reference(dtype, seed):
    x, w = _data(37, 8, 40, 16, dtype, fresh_generator(seed))
    out = CPU.linear_partials(x, w)
    assert out.dtype == torch.float32 and out.shape == (8, 37, 40)
    assert_close_to_ref(out, _ref64(x, w), torch.float32, "linear_partials")
    assert_close_to_ref(vendor.linear_partials(x, w), _ref64(x, w), torch.float32, "reference linear_partials")


def test_cpu_chunk_bits_independent_of_rows_and_of_the_other_chunks(seed):
    x, w = _data(70, 4, 48, 32, torch.float32, fresh_generator(seed))
    full = CPU.linear_partials(x, w)
    for rows in (slice(0, 1), slice(5, 6), slice(3, 40)):
        assert torch.equal(CPU.linear_partials(x[rows], w).view(torch.int32), full[:, rows].view(torch.int32))
    # Chunks 2..3 alone (what a rank at TP=2 holds) give the same bits as inside the full call.
    alone = CPU.linear_partials(x[:, 64:], w[2:])
    assert torch.equal(alone.view(torch.int32), full[2:].view(torch.int32))


def test_single_chunk_is_the_linear_before_rounding(seed):
    x, w = _data(9, 1, 24, 64, torch.float32, fresh_generator(seed))
    assert torch.equal(CPU.linear_partials(x, w)[0].view(torch.int32), CPU.linear(x, w[0]).view(torch.int32))


def test_shape_errors_name_the_op(seed):
    x, w = _data(4, 2, 8, 8, torch.float32, fresh_generator(seed))
    with pytest.raises(ValueError, match="linear_partials"):
        CPU.linear_partials(x[:, :10], w)
    with pytest.raises(ValueError, match="linear_partials"):
        CPU.linear_partials(x.double().float()[None], w)


def test_triton_interpreted_matches_float64(seed):
    pytest.importorskip("triton")
    from samebits.kernels.triton import matmul as tri

    x, w = _data(5, 4, 16, 32, torch.float32, fresh_generator(seed))
    assert_close_to_ref(tri.linear_partials(x, w), _ref64(x, w), torch.float32, "triton linear_partials")
