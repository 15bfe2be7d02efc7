"""The cuBLASLt route: taken only inside its measured domain, only after a self-test, and then bit-equal to Triton."""
import pytest
import torch
import torch.nn.functional as F

import samebits.kernels as K
from samebits.kernels import vendor_gemm as vg
from samebits.kernels.configs import TILE_CONFIGS
from samebits.probe.compare import assert_same_bits
from samebits.runtime.template import TEMPLATE_ENV, _env_to_apply

CFG = TILE_CONFIGS["vendor_gemm"]["config"]
needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")


@pytest.mark.parametrize("n,k,dtype,ok", [
    (4096, 4096, torch.bfloat16, True),
    (4096, 4096, torch.float16, True),
    (4096, 1000, torch.bfloat16, False),   # K tail: measured to differ
    (1, 4096, torch.bfloat16, False),      # N = 1: a GEMV path
    (4096, 4096, torch.float32, False),    # fp32 is not in the measured domain
])
def test_shape_domain(n, k, dtype, ok):
    assert vg.shape_allowed(n, k, dtype) is ok


def test_eager_calls_take_the_route_only_for_big_gemms():
    assert not vg.pays_eagerly(1, 4096, 4096)          # decode: the host cost would dominate
    assert not vg.pays_eagerly(4096, 4096, 4096)       # 137 GFLOP: measured faster on Triton eagerly
    assert vg.pays_eagerly(8192, 4096, 4096)
    assert vg.pays_eagerly(2048, 28672, 4096)


def test_cpu_never_takes_the_route():
    x, w = torch.randn(8192, 4096), torch.randn(4096, 4096)
    assert not vg.eligible(x.bfloat16(), w.bfloat16(), None)


def test_workspace_pinned_reads_the_template_value(monkeypatch):
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", TEMPLATE_ENV["CUBLASLT_WORKSPACE_SIZE"])
    assert vg.workspace_pinned()
    monkeypatch.setenv("CUBLASLT_WORKSPACE_SIZE", "1024")
    assert not vg.workspace_pinned()
    monkeypatch.delenv("CUBLASLT_WORKSPACE_SIZE")
    assert not vg.workspace_pinned()


def test_template_leaves_a_read_once_size_alone_when_cuda_is_already_up():
    # torch may already have read the old size: the route must then stay off, so the variable keeps telling the truth.
    saved = {k: None for k in TEMPLATE_ENV}
    assert "CUBLASLT_WORKSPACE_SIZE" in _env_to_apply(saved, cuda_was_up=False, mkl_pinned=True)
    assert "CUBLASLT_WORKSPACE_SIZE" not in _env_to_apply(saved, cuda_was_up=True, mkl_pinned=True)
    pinned = dict(saved, CUBLASLT_WORKSPACE_SIZE=TEMPLATE_ENV["CUBLASLT_WORKSPACE_SIZE"])
    assert "CUBLASLT_WORKSPACE_SIZE" in _env_to_apply(pinned, cuda_was_up=True, mkl_pinned=True)


def test_out_of_memory_leaves_the_shape_unproven(monkeypatch):
    def oom(x, w):
        raise torch.cuda.OutOfMemoryError("no room for the self-test")

    monkeypatch.setattr(vg, "lt_linear", oom)
    assert vg.self_test(64, 64, torch.bfloat16, "cpu") is False


def test_verdicts_are_shown_in_the_fingerprint_but_never_hashed(monkeypatch):
    from samebits.runtime.fingerprint import fingerprint

    # Process-wide verdicts: GPU tests run before this one in the same process leave theirs behind.
    monkeypatch.setattr(vg, "_VERDICTS", {})
    before = fingerprint()
    monkeypatch.setitem(vg._VERDICTS, (4096, 4096, "bfloat16", 0), True)
    after = fingerprint()
    assert after["vendor_gemm"] == {"4096x4096 bfloat16 cuda:0": True}
    assert after["hash"] == before["hash"]


# --- GPU: the measured facts the route rests on ------------------------------------------------------------------

REAL = [(4096, 4096), (6144, 4096), (28672, 4096), (4096, 14336)]


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("n,k", REAL)
def test_self_test_passes_at_real_shapes(n, k):
    assert vg.workspace_pinned(), "run with the template's env (samebits env --shell)"
    assert vg.self_test(n, k, torch.bfloat16, "cuda")


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("n,k", REAL[:2] + REAL[3:])
def test_route_gives_triton_bits_at_every_m(n, k):
    # Beyond the self-test's M list: decode and prefill sizes it never tried, whole outputs compared.
    from samebits.kernels.triton.matmul import linear as triton_linear

    g = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    w = (torch.randn(n, k, generator=g, device="cuda") * k ** -0.5).bfloat16()
    x = torch.randn(8192, k, generator=g, device="cuda").bfloat16()
    sizes = [1, 5, 16, 33, 100, 255, 300, 640, 1025, 1536, 2047, 4095, 6000, 8191] + list(range(1100, 8193, 997))
    for m in sizes:
        assert_same_bits(vg.lt_linear(x[:m], w), triton_linear(x[:m], w), f"cuBLASLt vs Triton, {m}x{n}x{k}")
    assert vg.eligible(x, w, None), "a proven shape at M=8192 must take the route"


@pytest.mark.gpu
@needs_cuda
def test_self_test_fails_on_a_split_k_impostor(monkeypatch):
    # Negative control: a route that adds two K halves (a split-K of 2) must not pass the self-test.
    def split_k(x, w):
        h = x.shape[1] // 2
        return (F.linear(x[:, :h], w[:, :h]).float() + F.linear(x[:, h:], w[:, h:]).float()).to(x.dtype)

    monkeypatch.setattr(vg, "lt_linear", split_k)
    assert not vg.self_test(4096, 4096, torch.bfloat16, "cuda")


@pytest.mark.gpu
@needs_cuda
def test_linear_routes_big_eager_gemms_and_stays_invariant():
    g = torch.Generator(device="cuda").manual_seed(torch.seed() % 2**31)
    w = (torch.randn(4096, 4096, generator=g, device="cuda") / 64).bfloat16()
    x = torch.randn(8192, 4096, generator=g, device="cuda").bfloat16()
    assert vg.eligible(x, w, None) and not vg.eligible(x[:64], w, None)
    full = K.linear(x, w)  # cuBLASLt (M = 8192)
    for m in (1, 17, 64, 257, 1023, 1024, 2049, 4096):
        assert_same_bits(K.linear(x[:m], w), full[:m], f"K.linear M={m} (Triton) vs M=8192 (cuBLASLt)")

