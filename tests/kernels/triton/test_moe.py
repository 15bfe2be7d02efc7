"""The fused MoE kernels (kernels/triton/moe.py) on small shapes: under TRITON_INTERPRET=1 on the CPU, natively where
CUDA exists. The H200's own bits and speeds are tests/kernels/triton/test_moe_gpu.py's."""
import pytest
import torch

from samebits.kernels import moe
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.helpers import fresh_generator, rand

pytestmark = pytest.mark.interpreter
pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
E, H, INTER, K = 4, 64, 48, 2  # INTER not a multiple of BK: the K tail of the down projection is masked
TILE = [0, 16, 16, 32, 4, 2]  # [max_T, BM, BN, BK, warps, stages]
MATMUL_TILE = [0, 16, 16, 32, 4, 2, 1]


def _tm():
    from samebits.kernels.triton import moe as tm

    return tm


def _case(g, t, dtype=torch.float32):
    w13 = rand((E, 2 * INTER, H), dtype, g, DEV, H ** -0.5)
    w2 = rand((E, H, INTER), dtype, g, DEV, INTER ** -0.5)
    x = rand((t, H), dtype, g, DEV)
    probs = torch.softmax(torch.randn(t, E, generator=g), -1).to(DEV)
    ids = moe.topk_ids(probs, K)
    return x, w13, w2, ids, moe.topk_weights(probs, ids, True)


def test_align_sorts_pairs_by_expert_into_whole_blocks(seed):
    ids = torch.tensor([[2, 0], [2, 3], [0, 2]], device=DEV)
    pairs, block_expert = _tm().align(ids, 5, 4)
    p = 6  # the sentinel
    assert pairs.tolist() == [1, 4, p, p, 0, 2, 5, p, 3, p, p, p] + [p] * (len(pairs) - 12)
    assert block_expert.tolist() == [0, 2, 3] + [-1] * (len(block_expert) - 3)
    assert len(block_expert) == (6 + 5 * 3 + 3) // 4  # P + min(E, P) * (BM - 1) rows at most


def test_fused_experts_equal_the_dense_kernels_per_expert(seed):
    tm = _tm()
    x, w13, w2, ids, w = _case(fresh_generator(seed), 13)
    assert_same_bits(tm.fused_experts(x, w13, w2, ids, w, config=TILE), tm.reference(x, w13, w2, ids, w, MATMUL_TILE),
                     "fused vs per-expert matmul")


def test_fused_experts_bf16_values(seed):
    # The interpreter rounds float32 -> bf16 by truncation where torch rounds to nearest, so only values here.
    tm = _tm()
    x, w13, w2, ids, w = _case(fresh_generator(seed), 9, torch.bfloat16)
    exact = moe.experts_by_loop(x.double(), w13.double(), w2.double(), ids, w, lambda a, b: a @ b.t(),
                                lambda h: torch.nn.functional.silu(h[:, :INTER]) * h[:, INTER:])
    err = (tm.fused_experts(x, w13, w2, ids, w, config=TILE).double() - exact).abs().max()
    assert err <= 2 ** -5 * exact.abs().max(), f"max |err| {err:.3e}"


def _needle(experts, g, sizes=(2, 17, 40)) -> int:
    x1, w13, w2, ids1, w1 = _case(g, 1)
    alone = experts(x1, w13, w2, ids1, w1)
    bad = 0
    for t in sizes:
        x, _, _, ids, w = _case(g, t)
        ids[: t // 2, 0] = ids1[0, 0]  # half the batch onto the needle's first expert
        ids[: t // 2, 1] = (ids1[0, 0] + 1) % E
        at = int(torch.randint(0, t, (1,), generator=g))
        x[at], ids[at], w[at] = x1[0], ids1[0], w1[0]
        bad += not mismatch(experts(x, w13, w2, ids, w)[at:at + 1], alone).same
    return bad


def test_a_token_alone_and_among_many_on_its_experts_gets_the_same_bits(seed):
    tm = _tm()
    assert _needle(lambda *a: tm.fused_experts(*a, config=TILE), fresh_generator(seed)) == 0
    # The tile may follow the token count: the default table's rows, and a 32-row block, give the same bits.
    assert _needle(lambda *a: tm.fused_experts(*a, config=[0, 32, 16, 16, 4, 2]), fresh_generator(seed), (40,)) == 0


def test_negative_control_split_k_is_caught(seed):
    """Each GEMM's K cut in two once the batch has more than one token, the halves' float32 sums added afterwards
    (split-K's order): the needle comparison sees it."""
    tm = _tm()

    def linear(a, b):
        return tm.matmul.linear(a, b, config=MATMUL_TILE)

    def split_k(a, b):
        half = a.shape[1] // 2
        parts = [tm.matmul.matmul_kn(a[:, s], b[:, s].t(), config=MATMUL_TILE, out_dtype=torch.float32)
                 for s in (slice(0, half), slice(half, None))]
        return (parts[0] + parts[1]).to(a.dtype)

    def variant(x, w13, w2, ids, w):
        return moe.experts_by_loop(x, w13, w2, ids, w, split_k if x.shape[0] > 1 else linear,
                                   tm.activation.silu_and_mul)

    assert _needle(variant, fresh_generator(seed), (17,)) > 0
