"""The Triton kernels on small shapes: under TRITON_INTERPRET=1 on CPU, natively where CUDA exists."""
import importlib

import pytest
import torch

from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.helpers import REL_TOL, assert_close_to_ref, fresh_generator, rand

pytestmark = pytest.mark.interpreter
pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
# The interpreter converts fp32 -> bf16 by truncation, not round-to-nearest; rms_norm rounds twice: two ulps.
TOL = {**REL_TOL, **({torch.bfloat16: 2 ** -6} if DEV == "cpu" else {})}
SMALL_TILE = [0, 16, 32, 32, 4, 2, 1]  # [max_M, BM, BN, BK, warps, stages, GROUP_M]
DTYPES = [torch.float32, torch.bfloat16, torch.float16]


def _mod(name):
    return importlib.import_module(f"samebits.kernels.triton.{name}")


def _close(out, ref, dtype, what):
    err = (out.double() - ref).abs().max().item()
    bound = TOL[dtype] * ref.abs().max().item()
    assert err <= bound, f"{what}: max |err| {err:.3e} > {bound:.3e} ({dtype})"


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("k", [96, 95])
def test_matmul_values(dtype, k, seed):
    mm, g = _mod("matmul"), fresh_generator(seed)
    x, w, b = rand((37, k), dtype, g, DEV), rand((80, k), dtype, g, DEV, k ** -0.5), rand((80,), dtype, g, DEV)
    ref = (x.double() @ w.double().t() + b.double()).cpu()
    _close(mm.linear(x, w, b, config=SMALL_TILE).cpu(), ref, dtype, "linear small tile")
    _close(mm.matmul(x, w.t().contiguous()).cpu(), ref - b.double().cpu(), dtype, "matmul default tile")


def test_matmul_fixed_tile_is_batch_invariant(seed):
    # Rows past M wrap onto real rows and are never stored: a row's bits must not see its neighbours.
    mm, g = _mod("matmul"), fresh_generator(seed)
    w = rand((40, 64), torch.float32, g, DEV)
    row = rand((64,), torch.float32, g, DEV)
    alone = mm.linear(row[None], w, config=SMALL_TILE)[0]
    for m in (2, 15, 16, 17, 33):
        x = rand((m, 64), torch.float32, g, DEV)
        p = int(torch.randint(0, m, (1,), generator=g))
        x[p] = row
        assert_same_bits(mm.linear(x, w, config=SMALL_TILE)[p], alone, f"triton linear M={m} slot {p}")
    # Negative control: K cut at 16 into two sums added afterwards (split-K's order) is seen by the same comparison.
    halves = mm.linear(row[None, :16], w[:, :16], config=SMALL_TILE) + mm.linear(row[None, 16:], w[:, 16:],
                                                                                 config=SMALL_TILE)
    assert mismatch(halves[0], alone).differing > 0, "the control changed no bit"


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_values(dtype, seed):
    rn, g = _mod("norms"), fresh_generator(seed)
    x, w, r = rand((9, 200), dtype, g, DEV, 3.0), rand((200,), dtype, g, DEV), rand((9, 200), dtype, g, DEV)
    ref = lambda t: (t.double() * torch.rsqrt(t.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double())
    _close(rn.rms_norm(x, w, 1e-6).cpu(), ref(x).cpu(), dtype, "rms_norm")
    normed, s = rn.add_rms_norm(x, r, w, 1e-6)
    _close(s.cpu(), (x.double() + r.double()).cpu(), dtype, "add_rms_norm sum")
    _close(normed.cpu(), ref(s).cpu(), dtype, "add_rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_one_block_path_gives_the_two_pass_bits(dtype, residual, seed):
    # A row that fits one block is kept in registers (ONE_BLOCK); the loop that reads it again must give its bits.
    rn, g = _mod("norms"), fresh_generator(seed)
    x, w, r = rand((5, 4096), dtype, g, DEV, 3.0), rand((4096,), dtype, g, DEV), rand((5, 4096), dtype, g, DEV)
    res = r if residual else None
    one, looped = rn._launch(x, res, w, 1e-6), rn._launch(x, res, w, 1e-6, two_pass=True)
    assert_same_bits(one[0], looped[0], f"rms_norm {dtype} residual={residual}")
    assert_same_bits(one[1], looped[1], f"rms_norm sum {dtype} residual={residual}")
    # The control: another eps changes the output's bits, so the comparison can fail.
    assert mismatch(rn._launch(x, res, w, 1e-3)[0], one[0]).differing > 0


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_values_over_several_blocks(dtype, seed):
    rn, g = _mod("norms"), fresh_generator(seed)
    x, w, r = rand((2, 5000), dtype, g, DEV, 3.0), rand((5000,), dtype, g, DEV), rand((2, 5000), dtype, g, DEV)
    ref = lambda t: (t.double() * torch.rsqrt(t.double().pow(2).mean(-1, keepdim=True) + 1e-6) * w.double())
    normed, s = rn.add_rms_norm(x, r, w, 1e-6)
    _close(normed.cpu(), ref(s).cpu(), dtype, "add_rms_norm over two blocks")


def test_rms_norm_rows_independent(seed):
    rn, g = _mod("norms"), fresh_generator(seed)
    w, row = rand((300,), torch.float32, g, DEV), rand((300,), torch.float32, g, DEV)
    alone = rn.rms_norm(row[None], w, 1e-5)[0]
    x = rand((7, 300), torch.float32, g, DEV)
    x[4] = row
    assert_same_bits(rn.rms_norm(x, w, 1e-5)[4], alone, "triton rms_norm")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("n", [50, 5000])
def test_softmax_values(dtype, n, seed):
    sm, g = _mod("softmax"), fresh_generator(seed)
    x = rand((5, n), dtype, g, DEV, 4.0)
    ref = torch.softmax(x.double(), -1).cpu()
    assert_close_to_ref(sm.softmax(x).cpu(), ref, torch.float32, "softmax")
    lref = torch.log_softmax(x.double(), -1).cpu()
    assert (sm.log_softmax(x).cpu().double() - lref).abs().max() < 1e-5 * (1 + x.float().abs().max().item())
    masked = x.clone()
    masked[:, : n // 2] = float("-inf")
    assert_close_to_ref(sm.softmax(masked).cpu(), torch.softmax(masked.double(), -1).cpu(), torch.float32, "masked")


def test_softmax_rows_independent(seed):
    sm, g = _mod("softmax"), fresh_generator(seed)
    row = rand((5000,), torch.float32, g, DEV, 3.0)
    x = rand((3, 5000), torch.float32, g, DEV, 3.0)
    x[2] = row
    assert_same_bits(sm.log_softmax(x)[2], sm.log_softmax(row[None])[0], "triton log_softmax")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_det_sum_values_and_rows(dtype, seed):
    rd, g = _mod("reduce"), fresh_generator(seed)
    x = rand((3, 3001), dtype, g, DEV)
    out = rd.det_sum_rows(x)
    assert out.dtype == torch.float32
    assert (out.cpu().double() - x.double().sum(-1).cpu()).abs().max() <= 1e-6 * x.double().abs().sum().item()
    assert_same_bits(rd.det_sum_rows(x[1:2])[0], out[1], "triton det_sum row")


def test_launchers_check_their_inputs():
    mm = _mod("matmul")
    with pytest.raises(AssertionError, match="inner dims"):
        mm.matmul(torch.ones(2, 3, device=DEV), torch.ones(4, 5, device=DEV))
    with pytest.raises(AssertionError, match="dtypes"):
        mm.matmul(torch.ones(2, 3, device=DEV, dtype=torch.float64), torch.ones(3, 5, device=DEV, dtype=torch.float64))


def test_facade_names_stay_functions_after_the_kernel_modules_load(seed):
    import samebits.kernels as K
    from samebits.kernels.cpu import backend as cpu

    _mod("matmul"), _mod("softmax")
    x = rand((3, 4), torch.float32, fresh_generator(seed))
    assert torch.equal(K.matmul(x, x.t()), cpu.matmul(x, x.t()))
    assert torch.equal(K.softmax(x), cpu.softmax(x))
