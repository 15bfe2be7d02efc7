"""The fused silu_and_mul kernel against its torch reference (kernels/activation.py): interpreter here, where numpy's
exp stands in for libdevice's, so to an ulp; bit for bit on the H200 (tests/kernels/test_gpu.py)."""
import pytest
import torch

from samebits.kernels.activation import silu_and_mul as reference
from samebits.kernels.triton.activation import silu_and_mul

pytestmark = pytest.mark.interpreter
SEED = 20261201


@pytest.mark.parametrize("shape", [(1, 2), (3, 2 * 1000), (2, 5, 2 * 1030)])
def test_kernel_matches_reference(shape):
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(shape, generator=g) * 6
    got, want = silu_and_mul(x), reference(x)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=4 * 2**-23, atol=0.0)  # a few ulps: numpy exp vs torch exp


def test_rows_are_independent():
    """A row's bits alone equal its bits among others; control: the same comparison sees a one-ulp change."""
    g = torch.Generator().manual_seed(SEED)
    x = torch.randn(6, 2 * 1030, generator=g)
    alone, batched = silu_and_mul(x[2:3]).view(torch.int32), silu_and_mul(x)[2:3].view(torch.int32)
    assert torch.equal(alone, batched)
    nudged = x[2:3].clone()
    nudged[0, 0] = torch.nextafter(nudged[0, 0], torch.tensor(float("inf")))
    assert not torch.equal(silu_and_mul(nudged).view(torch.int32), batched)


def test_launcher_names_an_odd_width():
    with pytest.raises(AssertionError, match="must be even"):
        silu_and_mul(torch.zeros(2, 7))
