"""The split-K atomic demo computes a matmul (its only fault is the order of its adds). Under the CPU interpreter the
programs run one after another, so only correctness can be checked here; the nondeterminism is a GPU measurement."""
import pytest
import torch

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("m,n,k,split", [(5, 70, 300, 4), (16, 64, 128, 2)])
def test_splitk_atomic_matmul_is_a_matmul(m, n, k, split):
    from samebits.kernels.demos.splitk_atomic import splitk_atomic_matmul

    g = torch.Generator().manual_seed(0)
    # float32: the interpreter mishandles bfloat16 loads (numpy has no bfloat16); the GPU probe uses bfloat16.
    x, w = torch.randn(m, k, generator=g), torch.randn(n, k, generator=g)
    dev = "cuda" if torch.cuda.is_available() else "cpu"
    out = splitk_atomic_matmul(x.to(dev), w.to(dev), split_k=split).cpu()
    assert out.dtype == torch.float32 and out.shape == (m, n)
    tol = 5e-2 if dev == "cuda" else 1e-4  # tl.dot on fp32 uses TF32 on the GPU
    torch.testing.assert_close(out, x @ w.T, rtol=tol, atol=tol)
