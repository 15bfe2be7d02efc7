"""CPU deterministic path: accuracy against float64 references, and fail-loud refusals."""
import pytest
import torch

import samebits.kernels as K
from samebits.kernels import UnsupportedOpError, get_ops
from tests.kernels.helpers import DTYPES, assert_close_to_ref, fresh_generator, rand


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k,n", [(96, 80), (257, 8), (33, 3), (64, 1), (512, 130)])
def test_linear_matches_float64(dtype, k, n, seed):
    g = fresh_generator(seed)
    x, w, b = rand((37, k), dtype, g), rand((n, k), dtype, g, scale=k ** -0.5), rand((n,), dtype, g)
    ref = x.double() @ w.double().t() + b.double()
    assert_close_to_ref(K.linear(x, w, b), ref, dtype, "linear")
    assert_close_to_ref(K.matmul(x, w.t().contiguous()), ref - b.double(), dtype, "matmul")
    assert K.linear(x, w).dtype == dtype


def test_linear_keeps_leading_dims(seed):
    g = fresh_generator(seed)
    x, w = rand((2, 3, 16), torch.float32, g), rand((24, 16), torch.float32, g)
    assert K.linear(x, w).shape == (2, 3, 24)


def _rms_ref(x, w, eps):
    xd = x.double()
    return xd * torch.rsqrt(xd.pow(2).mean(-1, keepdim=True) + eps) * w.double()


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_float64(dtype, seed):
    g = fresh_generator(seed)
    x, w, r = rand((19, 200), dtype, g, scale=3.0), rand((200,), dtype, g), rand((19, 200), dtype, g)
    assert_close_to_ref(K.rms_norm(x, w, 1e-6), _rms_ref(x, w, 1e-6), dtype, "rms_norm")
    normed, s = K.add_rms_norm(x, r, w, 1e-6)
    assert torch.equal(s, x + r)
    assert_close_to_ref(normed, _rms_ref(s, w, 1e-6), dtype, "add_rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [1, 50, 3000])
def test_softmax_matches_float64(dtype, n, seed):
    g = fresh_generator(seed)
    x = rand((7, n), dtype, g, scale=4.0)
    sm, lsm = K.softmax(x), K.log_softmax(x)
    assert sm.dtype == lsm.dtype == torch.float32
    # fp32 math on already-rounded inputs: the bound is fp32's, whatever the input dtype.
    assert_close_to_ref(sm, torch.softmax(x.double(), -1), torch.float32, "softmax")
    assert (lsm.double() - torch.log_softmax(x.double(), -1)).abs().max() < 1e-5 * (1 + x.float().abs().max())


def test_softmax_other_dim(seed):
    g = fresh_generator(seed)
    x = rand((5, 6, 7), torch.float32, g)
    assert_close_to_ref(K.softmax(x, dim=1), torch.softmax(x.double(), 1), torch.float32, "softmax dim=1")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape,dim", [((100_003,), None), ((6, 5000), -1), ((300, 4), 0)])
def test_det_sum_and_mean_match_float64(dtype, shape, dim, seed):
    g = fresh_generator(seed)
    x = rand(shape, dtype, g)
    ref = x.double().sum() if dim is None else x.double().sum(dim)
    n = x.numel() if dim is None else x.shape[dim]
    tol = 1e-6 * x.double().abs().sum().item() + (ref.abs().max().item() * {torch.float32: 0, torch.bfloat16: 8e-3,
                                                                            torch.float16: 1e-3}[dtype])
    assert (K.det_sum(x, dim).double() - ref).abs().max().item() <= tol + 1e-30
    assert (K.det_mean(x, dim).double() - ref / n).abs().max().item() <= (tol + 1e-30) / n


def test_silu_and_mul(seed):
    g = fresh_generator(seed)
    x = rand((4, 64), torch.bfloat16, g)
    ref = torch.nn.functional.silu(x[:, :32].double()) * x[:, 32:].double()
    assert_close_to_ref(K.silu_and_mul(x), ref, torch.bfloat16, "silu_and_mul")


@pytest.mark.parametrize("dtype", [torch.float64, torch.int32, torch.int64])
@pytest.mark.parametrize("op", ["linear", "rms_norm", "softmax", "log_softmax", "det_sum", "add_rms_norm"])
def test_deterministic_path_fails_loud(op, dtype):
    x = torch.ones(3, 8, dtype=dtype)
    ops = get_ops("deterministic", "cpu")
    calls = {"linear": lambda: ops.linear(x, x), "rms_norm": lambda: ops.rms_norm(x, x[0], 1e-6),
             "softmax": lambda: ops.softmax(x), "log_softmax": lambda: ops.log_softmax(x),
             "det_sum": lambda: K.det_sum(x), "add_rms_norm": lambda: ops.add_rms_norm(x, x, x[0], 1e-6)}
    with pytest.raises(UnsupportedOpError) as e:
        calls[op]()
    msg = str(e.value)
    assert op in msg and str(dtype) in msg and "cpu" in msg and "(3, 8)" in msg


def test_unsupported_device_fails_loud():
    with pytest.raises(UnsupportedOpError, match="device=meta"):
        K.linear(torch.empty(2, 4, device="meta"), torch.empty(3, 4, device="meta"))


def test_registry_modes(seed):
    with pytest.raises(ValueError, match="mode"):
        get_ops("fastest", "cpu")
    fast, det = get_ops("fast", "cpu"), get_ops("deterministic", "cpu")
    assert (fast.mode, det.mode, str(det.device)) == ("fast", "deterministic", "cpu")
    g = fresh_generator(seed)
    x, w = rand((3, 32), torch.float32, g), rand((16, 32), torch.float32, g)
    assert torch.allclose(fast.linear(x, w), det.linear(x, w), atol=1e-5)
    assert torch.allclose(fast.rms_norm(x, w[0, :32].abs(), 1e-6), det.rms_norm(x, w[0, :32].abs(), 1e-6), atol=1e-5)
    assert fast.softmax(x).dtype == det.log_softmax(x).dtype == torch.float32
    assert torch.equal(fast.silu_and_mul(x), det.silu_and_mul(x)) or torch.allclose(
        fast.silu_and_mul(x), det.silu_and_mul(x), atol=1e-6)


@pytest.mark.parametrize("dtype", DTYPES)
def test_fast_rms_norm_keeps_hf_semantics(dtype, seed):
    """The fast backend's norm (torch's F.rms_norm, then the weight in x.dtype) rounds where HF Llama's spelled-out
    form does: bit for bit on the CPU. Control: scaling by the weight before rounding differs."""
    from samebits.kernels import vendor

    g = fresh_generator(seed)
    x, w = rand((8, 96), dtype, g) * 3, rand((96,), dtype, g)
    xf = x.float()
    hf = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6)).to(dtype) * w
    assert torch.equal(vendor.rms_norm(x, w, 1e-6), hf)
    if dtype != torch.float32:
        unrounded = (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * w.float()).to(dtype)
        assert not torch.equal(unrounded, hf), "the control lost its rounding difference"
