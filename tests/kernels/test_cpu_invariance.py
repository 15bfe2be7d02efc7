"""Bitwise batch invariance of the CPU deterministic path: a row alone equals the same row anywhere inside M."""
import pytest
import torch

import samebits.kernels as K
from samebits.kernels.race import race_keys
from samebits.probe.compare import assert_same_bits
from tests.kernels.helpers import BATCH_SIZES, DTYPES, check_row_invariance, fresh_generator, rand, rows_that_differ

H = 96


def _ops(dtype, g):
    w = rand((80, H), dtype, g, scale=H ** -0.5)
    b = rand((80,), dtype, g)
    nw = rand((H,), dtype, g)
    return {
        "linear": lambda x: K.linear(x, w, b),
        "matmul": lambda x: K.matmul(x, w.t()),
        "rms_norm": lambda x: K.rms_norm(x, nw, 1e-6),
        # Rows carry [x | residual] so a row's residual moves with it.
        "add_rms_norm": lambda xr: torch.cat(K.add_rms_norm(xr[:, :H], xr[:, H:], nw, 1e-6), dim=-1),
        "softmax": lambda x: K.softmax(x),
        "log_softmax": lambda x: K.log_softmax(x),
        "det_sum": lambda x: K.det_sum(x, dim=-1),
        "det_mean": lambda x: K.det_mean(x, dim=-1),
        "silu_and_mul": lambda x: K.silu_and_mul(x),
        # Every row drawn with one key, so a row's float64 logs see the same inputs at every slot of the batch.
        "race_keys": lambda x: race_keys(x.float(), *(torch.full((len(x),), 7, dtype=torch.int64),) * 3, 0),
    }


OPS = list(_ops(torch.float32, torch.Generator()).keys())


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("op", OPS)
def test_row_alone_equals_row_in_batch(op, dtype, seed):
    g = fresh_generator(seed)
    fn = _ops(dtype, g)[op]
    width = 2 * H if op == "add_rms_norm" else H
    row = rand((width,), dtype, g, scale=2.0)
    check_row_invariance(fn, row, lambda m: rand((m, width), dtype, g, scale=2.0), BATCH_SIZES, g, f"{op} {dtype}")


# Shapes where torch's CPU mm (MKL) gave a row different bits by its position inside one fixed-size block:
# 2 <= N <= 11 with odd K. The N padding in samebits.kernels.cpu must keep them invariant.
@pytest.mark.parametrize("k,n", [(257, 8), (33, 2), (17, 11), (129, 5), (64, 1), (1023, 16), (4097, 33)])
def test_linear_invariant_at_awkward_shapes(k, n, seed):
    g = fresh_generator(seed)
    w = rand((n, k), torch.float32, g)
    row = rand((k,), torch.float32, g)
    sizes = [1, 2, 3, 5, 17, 63, 64, 65, 129]
    check_row_invariance(lambda x: K.linear(x, w), row, lambda m: rand((m, k), torch.float32, g), sizes, g,
                         f"linear K={k} N={n}")


def test_linear_invariant_at_model_shape(seed):
    g = fresh_generator(seed)
    w = rand((1024, 1024), torch.bfloat16, g, scale=1 / 32)
    row = rand((1024,), torch.bfloat16, g)
    check_row_invariance(lambda x: K.linear(x, w), row, lambda m: rand((m, 1024), torch.bfloat16, g),
                         [1, 7, 64, 65, 300], g, "linear 1024x1024 bf16")


def test_softmax_invariant_at_vocab_width(seed):
    # One row alone is a single-output reduction, where torch would split the row across threads.
    g = fresh_generator(seed)
    row = rand((128_256,), torch.float32, g, scale=5.0)
    check_row_invariance(K.log_softmax, row, lambda m: rand((m, 128_256), torch.float32, g, scale=5.0),
                         [2, 3, 65], g, "log_softmax V=128256")


def test_det_sum_whole_tensor_is_shape_stable(seed):
    # The same values summed as a flat tensor or any 2-D view give one answer (the order is a function of n).
    g = fresh_generator(seed)
    x = rand((4096 * 3,), torch.float32, g)
    assert torch.equal(K.det_sum(x), K.det_sum(x.view(96, 128)))
    assert torch.equal(K.det_sum(x), K.det_sum(x.view(3, 4096)))


def _m_dependent_sum(x):
    # Deliberately wrong: the first partial's length follows M, so a row's order depends on its batch.
    cut = 1 + len(x) % (x.shape[1] - 1)
    return x[:, :cut].sum(-1) + x[:, cut:].sum(-1)


def test_negative_control_detects_m_dependent_reduction(seed):
    g = fresh_generator(seed)
    row = rand((H,), torch.float32, g, scale=100.0)
    batch = lambda m: rand((m, H), torch.float32, g, scale=100.0)
    assert rows_that_differ(_m_dependent_sum, row, batch, BATCH_SIZES), "the check cannot see an M-dependent order"
    with pytest.raises(AssertionError, match="differ"):
        for _ in range(20):  # rounding can hide one reordering; twenty fresh rows cannot all hide it
            row = rand((H,), torch.float32, g, scale=100.0)
            check_row_invariance(_m_dependent_sum, row, batch, BATCH_SIZES, g, "m-dependent")


def test_negative_control_vendor_cpu_mm_varies_with_m(seed):
    g = fresh_generator(seed)
    k, n = 512, 256
    w = rand((k, n), torch.float32, g)
    row = rand((k,), torch.float32, g)
    differ = rows_that_differ(lambda x: x @ w, row, lambda m: rand((m, k), torch.float32, g), BATCH_SIZES)
    if not differ:
        pytest.skip("vendor CPU mm happened to be batch-invariant on this machine")
    # The same helper that passes samebits' matmul at these sizes sees the vendor's M-dependence.
    with pytest.raises(AssertionError, match="differ"):
        check_row_invariance(lambda x: x @ w, row, lambda m: rand((m, k), torch.float32, g), differ, g, "vendor mm")


@pytest.mark.parametrize("dtype", DTYPES)
def test_bmm_entry_alone_equals_entry_in_batch(dtype, seed):
    # The drop-in mode's bmm (attention scores in eager models): an entry must not see its batch neighbours.
    from samebits.kernels.cpu.backend import bmm

    g = fresh_generator(seed)
    for m, k, n in [(12, 16, 12), (1, 16, 1), (70, 33, 5)]:
        entry = torch.cat([rand((m, k), dtype, g), rand((k, n), dtype, g).t()], dim=0)  # [m + n, k]
        def fn(e, m=m):
            return bmm(e[:, :m], e[:, m:].transpose(1, 2))

        def batch(b, m=m, n=n, k=k):
            return rand((b, m + n, k), dtype, g)

        check_row_invariance(fn, entry, batch, [2, 3, 17, 64, 256], g, f"bmm {m}x{k}x{n} {dtype}")
        ref = entry[:m].double() @ entry[m:].double().t()
        assert (fn(entry[None])[0].double() - ref).abs().max() <= 1e-2 * ref.abs().max()


# Widths whose element count leaves torch's vector loops a scalar tail (not a multiple of 32 floats).
@pytest.mark.parametrize("width", [33, 100, 1001])
def test_silu_and_mul_invariant_where_vector_tails_fall(width, seed):
    g = fresh_generator(seed)
    row = rand((2 * width,), torch.float32, g, scale=4.0)
    check_row_invariance(K.silu_and_mul, row, lambda m: rand((m, 2 * width), torch.float32, g, scale=4.0),
                         BATCH_SIZES, g, f"silu_and_mul I={width}")


def test_negative_control_torch_silu_tail_gets_other_bits(seed):
    # Why samebits spells silu out: torch's CPU silu computes a vector tail with other bits than the vector body,
    # so an element's bits follow where the tensor's size puts it.
    g = fresh_generator(seed)
    x = rand((1_000_003,), torch.float32, g, scale=8.0)
    full = torch.nn.functional.silu(x)
    pieces = torch.cat([torch.nn.functional.silu(x[i:i + 7].clone()) for i in range(0, 7 * 2000, 7)])
    if torch.equal(pieces, full[:pieces.numel()]):
        pytest.skip("torch's silu happened to agree between its vector body and tail here")
    ones = torch.ones_like(x)
    ours_full = K.silu_and_mul(torch.stack([x, ones], 0).view(1, -1))[0]
    ours_pieces = torch.cat([K.silu_and_mul(torch.stack([x[i:i + 7], ones[:7]], 0).view(1, 14))[0]
                             for i in range(0, 7 * 2000, 7)])
    assert_same_bits(ours_pieces, ours_full[:ours_pieces.numel()], "samebits silu: pieces vs whole")
