"""The fixed merge tree and the shard layouts, without processes: the TP-invariant claim reduced to its arithmetic."""
import pytest
import torch

from samebits.distributed import shard as sh
from samebits.distributed.reduce import TP_MAX, tree_merge
from samebits.models.config import ModelConfig


def test_tree_merge_is_a_subtree_merge_at_every_tp_size(seed):
    """A rank at TP=t merges its TP_MAX/t neighbouring chunks, then the t results are merged: always TP=1's bits."""
    g = torch.Generator().manual_seed(seed)
    partials = torch.randn(TP_MAX, 64, 33, generator=g) * torch.logspace(-3, 3, 33)
    want = tree_merge(partials)
    for t in (2, 4, 8):
        local = torch.stack([tree_merge(p) for p in partials.chunk(t)])
        assert torch.equal(tree_merge(local).view(torch.int32), want.view(torch.int32)), f"TP={t}"


def test_negative_control_rank_order_sum_is_not_the_tree(seed):
    """Summing the same partials left to right (another fixed order) moves bits: the tree's shape matters."""
    g = torch.Generator().manual_seed(seed)
    partials = torch.randn(TP_MAX, 256, 64, generator=g) * torch.logspace(-3, 3, 64)
    sequential = partials[0].clone()
    for p in partials[1:]:
        sequential += p
    assert not torch.equal(sequential.view(torch.int32), tree_merge(partials).view(torch.int32))


def test_tree_merge_refuses_a_count_that_is_not_a_power_of_two():
    with pytest.raises(ValueError, match="power-of-two"):
        tree_merge(torch.zeros(3, 2))


CFG = ModelConfig("llama", vocab_size=1001, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=8,
                  num_kv_heads=8, head_dim=4, max_position_embeddings=64)


@pytest.mark.parametrize("world", [1, 2, 4])
def test_column_pieces_regroup_to_the_ranks_slice_of_q_k_v(world):
    """Concatenating every rank's regrouped output gives the rank's heads of [q | k | v] in head order."""
    q, kv = CFG.q_size, CFG.kv_size
    rows = torch.arange(q + 2 * kv, dtype=torch.float32)
    for invariant in (False, True):
        s = sh.Shard(0, world, invariant)
        per = [t.reshape(1, -1) for t in sh.column(rows, [q, kv, kv], s).chunk(s.pieces)]
        plan = sh.ColumnPlan((q // s.splits, kv // s.splits, kv // s.splits))
        got = plan.regroup(per)[0]
        lq, lkv = q // world, kv // world
        want = torch.cat([rows[:lq], rows[q:q + lkv], rows[q + kv:q + kv + lkv]])
        assert torch.equal(got, want)


def test_row_chunks_and_padded_vocab():
    w = torch.arange(6 * 16, dtype=torch.float32).reshape(6, 16)
    chunks = sh.row(w, sh.Shard(1, 2, True))  # rank 1 of 2, TP_MAX chunks of 2 columns: chunks 4..7
    assert chunks.shape == (4, 6, 2) and torch.equal(chunks[0], w[:, 8:10])
    assert sh.padded_vocab(CFG, sh.Shard(0, 2, True)) == 1008


def test_indivisible_heads_are_refused_naming_the_field():
    odd = ModelConfig("llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1, num_heads=4,
                      num_kv_heads=2, head_dim=8, max_position_embeddings=64)
    with pytest.raises(ValueError, match="num_heads divisible by 8"):
        sh.check_divisible(odd, sh.Shard(0, 1, True))
    with pytest.raises(ValueError, match="tensor_parallel_size=4 needs num_kv_heads"):
        sh.check_divisible(odd, sh.Shard(0, 4, False))
