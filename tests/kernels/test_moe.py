"""The MoE ops on the CPU: the exact top-k, the rank-order weights and combine, and the per-expert route, whose
token outputs never depend on how many other tokens chose the same experts (kernels/moe.py, kernels/cpu/backend.py)."""
import pytest
import torch

from samebits.kernels import get_ops, moe
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.helpers import fresh_generator, rand

DET, FAST = get_ops("deterministic", "cpu"), get_ops("fast", "cpu")
E, H, INTER, K = 8, 128, 96, 2


def test_topk_breaks_ties_by_expert_index_and_orders_by_score():
    scores = torch.tensor([[0.1, 0.3, 0.3, 0.2, 0.3], [0.0, -0.0, -1.0, 2.0, 0.0], [-2.0, -1.0, -3.0, -1.0, -5.0]])
    assert moe.topk_ids(scores, 3).tolist() == [[1, 2, 4], [3, 0, 4], [1, 3, 0]]
    # Rotated, the equal scores go to the lowest of their new indices; -0.0 ranks just below +0.0.
    assert DET.moe_topk(scores.roll(2, dims=1), 3).tolist() == [[1, 3, 4], [0, 1, 2], [0, 3, 2]]


def test_topk_agrees_with_torch_topk_without_ties(seed):
    g = fresh_generator(seed)
    scores = torch.softmax(torch.randn(64, 128, generator=g), -1)
    assert torch.equal(moe.topk_ids(scores, 8), torch.topk(scores, 8).indices)
    assert torch.equal(moe.topk_ids(scores[:1], 8), moe.topk_ids(scores, 8)[:1])


def test_weights_are_renormalised_left_to_right_and_combined_in_rank_order():
    probs = torch.tensor([[0.5, 0.1, 0.3, 0.1]])
    ids = torch.tensor([[0, 2, 1]])
    w = moe.topk_weights(probs, ids, normalise=True)
    assert torch.equal(w, torch.tensor([[0.5, 0.3, 0.1]]) / ((torch.tensor(0.5) + 0.3) + 0.1))
    assert torch.equal(moe.topk_weights(probs, ids, normalise=False), torch.tensor([[0.5, 0.3, 0.1]]))
    ones = torch.ones(1, 3)  # float32: (1e8 + 1) + -1e8 = 0, (1e8 + -1e8) + 1 = 1; the fold follows the ranks
    assert moe.combine(torch.tensor([[[1e8], [1.0], [-1e8]]]), ones, torch.float32).item() == 0.0
    assert moe.combine(torch.tensor([[[1e8], [-1e8], [1.0]]]), ones, torch.float32).item() == 1.0


def _experts(g, dtype=torch.float32):
    return rand((E, 2 * INTER, H), dtype, g, scale=H ** -0.5), rand((E, H, INTER), dtype, g, scale=INTER ** -0.5)


def _route(x, g, k=K):
    probs = torch.softmax(torch.randn(x.shape[0], E, generator=g), -1)
    ids = moe.topk_ids(probs, k)
    return ids, moe.topk_weights(probs, ids, True)


def test_cpu_experts_are_the_dense_mlp_of_each_expert(seed):
    g = fresh_generator(seed)
    w13, w2 = _experts(g)
    x = rand((5, H), torch.float32, g)
    ids, w = _route(x, g)
    out = DET.moe_experts(x, w13, w2, ids, w)
    for t in range(5):
        ys = [DET.linear(DET.silu_and_mul(DET.linear(x[t:t + 1], w13[e])), w2[e]) for e in ids[t].tolist()]
        assert_same_bits(out[t:t + 1], moe.combine(torch.stack(ys, 1), w[t:t + 1], x.dtype), f"token {t}")


def _needle_mismatches(experts, g, dtype) -> int:
    """A token alone vs inside batches of 1..64 other tokens whose routing piles onto or avoids its experts."""
    w13, w2 = _experts(g, dtype)
    needle = rand((1, H), dtype, g)
    n_ids, n_w = _route(needle, g)
    alone = experts(needle, w13, w2, n_ids, n_w)
    bad = 0
    for m in (1, 2, 3, 7, 16, 31, 64):
        x = rand((m + 1, H), dtype, g)
        ids, w = _route(x, g)
        if m % 2:  # every other token onto the needle's first expert: its load follows the batch
            ids[:, 0] = n_ids[0, 0]
            ids[:, 1] = torch.where(ids[:, 1] == n_ids[0, 0], (n_ids[0, 0] + 1) % E, ids[:, 1])
        at = int(torch.randint(0, m + 1, (1,), generator=g))
        x[at], ids[at], w[at] = needle[0], n_ids[0], n_w[0]
        bad += not mismatch(experts(x, w13, w2, ids, w)[at:at + 1], alone).same
    return bad


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_expert_output_does_not_depend_on_the_experts_load(dtype, seed):
    assert _needle_mismatches(DET.moe_experts, fresh_generator(seed), dtype) == 0


def test_negative_control_a_load_dependent_combine_is_caught(seed):
    """The same comparison catches a combine whose order follows the batch (summing the k outputs pairwise once the
    batch is large, as a vectorised reduction might)."""
    def variant(x, w13, w2, ids, w):
        out = DET.moe_experts(x, w13, w2, ids, w)
        return torch.nextafter(out, torch.full_like(out, float("inf"))) if x.shape[0] > 8 else out

    assert _needle_mismatches(variant, fresh_generator(seed), torch.float32) > 0


def test_fast_experts_match_the_deterministic_ones_closely(seed):
    g = fresh_generator(seed)
    w13, w2 = _experts(g)
    x = rand((20, H), torch.float32, g)
    ids, w = _route(x, g)
    det, fast = DET.moe_experts(x, w13, w2, ids, w), FAST.moe_experts(x, w13, w2, ids, w)
    assert (det - fast).abs().max() <= 1e-5 * det.abs().max()


def test_shared_gate_is_the_sigmoid():
    x = torch.linspace(-30, 30, 1001)[:, None]
    assert (moe.shared_gate(x) - torch.sigmoid(x)).abs().max() <= 2 ** -23


@pytest.mark.parametrize("bad,named", [
    (lambda x, w13, w2, ids, w: (x[:, :-1], w13, w2, ids, w), "expert shapes disagree"),
    (lambda x, w13, w2, ids, w: (x, w13, w2, ids.int(), w), "int64"),
    (lambda x, w13, w2, ids, w: (x, w13, w2, ids[:-1], w), r"\[T, k\]"),
])
def test_bad_arguments_are_named(bad, named):
    g = fresh_generator(0)
    w13, w2 = _experts(g)
    x = rand((4, H), torch.float32, g)
    ids, w = _route(x, g)
    with pytest.raises(ValueError, match=named):
        DET.moe_experts(*bad(x, w13, w2, ids, w))
