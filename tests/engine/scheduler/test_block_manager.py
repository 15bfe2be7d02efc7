import hashlib
import random

import pytest

from samebits.engine.scheduler.block_manager import ROOT_HASH, BlockManager, IntegrityError, hash_block
from samebits.engine.sequence import Sequence

BS = 4


def seq(tokens, **kw):
    return Sequence("r", list(tokens), **kw)


def compute(bm, s, n=None):
    """What one step does for s: allocate/append room, mark the tokens computed, cache full blocks."""
    n = s.num_uncomputed if n is None else n
    if not s.block_table and s.num_computed_tokens == 0:
        bm.allocate(s, n - bm.num_cached_prefix_tokens(s))
    else:
        bm.append_slots(s, n)
    s.num_computed_tokens = s.num_computed_tokens + n if s.block_table else n
    bm.cache_computed_blocks(s)


def run_prompt(bm, tokens):
    """Admit a prompt, compute it all but the last token (as a finished prefill + decodes leave it), free it."""
    s = seq(tokens)
    hit = bm.allocate(s)
    s.num_computed_tokens = s.num_tokens - 1
    bm.cache_computed_blocks(s)
    bm.free(s)
    return s, hit


def test_hash_is_stable_and_chained():
    expect = hashlib.blake2b(ROOT_HASH, digest_size=16)
    expect.update(b"".join(t.to_bytes(8, "little", signed=True) for t in (1, 2, 3, 4)))
    assert hash_block(ROOT_HASH, [1, 2, 3, 4]) == expect.digest()
    a = hash_block(ROOT_HASH, [9, 9, 9, 9])
    assert hash_block(a, [1, 2, 3, 4]) != hash_block(ROOT_HASH, [1, 2, 3, 4])


def test_allocate_counts_blocks_and_usage():
    bm = BlockManager(10, BS)
    s = seq(range(1, 10))  # 9 tokens -> 3 blocks
    assert bm.can_allocate(s) and bm.allocate(s) == 0
    assert len(s.block_table) == 3 and bm.num_free_blocks == 7 and bm.usage == pytest.approx(0.3)
    assert s.num_computed_tokens == 0 and s.num_cached_tokens == 0
    bm.check_integrity()
    bm.free(s)
    assert bm.num_free_blocks == 10 and s.block_table == [] and bm.usage == 0.0
    bm.check_integrity()


def test_chunked_allocation_grows_with_append_slots():
    bm = BlockManager(10, BS)
    s = seq(range(1, 12))
    bm.allocate(s, 5)
    assert len(s.block_table) == 2
    s.num_computed_tokens = 5
    assert bm.append_slots(s, 3) == [] and len(s.block_table) == 2  # 8 tokens still fit in 2 blocks
    assert len(bm.append_slots(s, 6)) == 1  # 11 tokens need a third
    bm.check_integrity()


def test_prefix_hit_is_block_granular_and_leaves_one_token():
    bm = BlockManager(16, BS)
    run_prompt(bm, list(range(1, 12)) + [50])  # 12 tokens, 11 computed -> blocks 0, 1 cached
    s = seq(list(range(1, 9)) + [70, 71])
    assert bm.allocate(s) == 8 and s.num_computed_tokens == 8 and s.num_cached_tokens == 8
    exact = seq(range(1, 9))  # the whole prompt is cached, yet one token must be left to produce logits
    assert bm.allocate(exact) == 4 and exact.num_computed_tokens == 4
    assert bm.stats.queries == 12 + 10 + 8 and bm.stats.hits == 12
    bm.check_integrity()


def test_prefix_hit_requires_the_whole_chain():
    bm = BlockManager(16, BS)
    run_prompt(bm, [1, 2, 3, 4, 5, 6, 7, 8, 9])
    other_first_block = seq([9, 9, 9, 9, 5, 6, 7, 8, 9])
    assert bm.allocate(other_first_block) == 0


def test_shared_blocks_are_ref_counted():
    bm = BlockManager(16, BS)
    run_prompt(bm, range(1, 10))
    a, b = seq(range(1, 10)), seq(range(1, 10))
    bm.allocate(a), bm.allocate(b)
    shared = a.block_table[:2]
    assert b.block_table[:2] == shared and a.block_table[2] != b.block_table[2]
    assert [bm.blocks[i].ref_count for i in shared] == [2, 2]
    bm.free(a)
    assert [bm.blocks[i].ref_count for i in shared] == [1, 1] and not set(shared) & set(bm.free_ids)
    bm.check_integrity()
    bm.free(b)
    assert set(shared) <= set(bm.free_ids) and all(bm.blocks[i].hash for i in shared)
    bm.check_integrity()


def test_can_allocate_counts_revived_cached_blocks():
    bm = BlockManager(3, BS)
    run_prompt(bm, range(1, 10))  # 2 cached free blocks + 1 empty
    s = seq(list(range(1, 9)) + [99] * 5)  # hit 2 blocks, 5 new tokens need 2 more: 4 > 3
    assert not bm.can_allocate(s)
    with pytest.raises(RuntimeError, match="can_allocate"):
        bm.allocate(s)
    assert bm.can_allocate(s, 4) and bm.allocate(s, 4) == 8
    bm.check_integrity()


def test_eviction_prefers_empty_blocks_then_lru():
    bm = BlockManager(6, BS)
    run_prompt(bm, [1] * 8 + [0])  # caches 2 blocks (older)
    run_prompt(bm, [2] * 8 + [0])  # caches 2 blocks (newer)
    assert len(bm.cached) == 4 and bm.num_free_blocks == 6
    s = seq([3] * 8)
    bm.allocate(s)  # 2 empty blocks exist: nothing evicted
    assert len(bm.cached) == 4 and bm.stats.evictions == 0
    s.num_computed_tokens = 8
    bm.append_slots(s, 4)  # 12 tokens -> 3rd block evicts the LRU cached block: the tail of prompt [1]*8
    assert bm.stats.evictions == 1
    assert bm.num_cached_prefix_tokens(seq([1] * 8 + [0])) == 4, "the root block is evicted after its tail"
    assert bm.num_cached_prefix_tokens(seq([2] * 8 + [0])) == 8
    bm.check_integrity()


def test_twin_blocks_computed_concurrently_stay_private():
    bm = BlockManager(8, BS)
    a, b = seq(range(1, 10)), seq(range(1, 10))
    bm.allocate(a), bm.allocate(b)
    for s in (a, b):
        s.num_computed_tokens = 8
        bm.cache_computed_blocks(s)
    assert len(bm.cached) == 2 and all(bm.blocks[i].hash is None for i in b.block_table)
    bm.check_integrity()
    b_blocks = list(b.block_table)
    bm.free(b)
    assert set(list(bm.free_ids)[:3]) == set(b_blocks), "uncached blocks are handed out first"
    bm.check_integrity()


def test_only_full_computed_blocks_are_cached():
    bm = BlockManager(8, BS)
    s = seq(range(1, 12))
    bm.allocate(s)
    s.num_computed_tokens = 7
    assert bm.cache_computed_blocks(s) == 1
    s.num_computed_tokens = 10
    assert bm.cache_computed_blocks(s) == 1 and bm.cache_computed_blocks(s) == 0
    bm.check_integrity()


def test_prefix_caching_off_never_hits():
    bm = BlockManager(8, BS, enable_prefix_caching=False)
    run_prompt(bm, range(1, 10))
    assert not bm.cached and bm.allocate(seq(range(1, 10))) == 0 and bm.stats.queries == 0


def test_reset_prefix_cache_drops_only_free_blocks():
    bm = BlockManager(8, BS)
    run_prompt(bm, range(1, 10))
    live = seq(range(1, 10))
    bm.allocate(live)
    run_prompt(bm, [7] * 9)
    assert bm.reset_prefix_cache() == 2 and len(bm.cached) == 2
    bm.check_integrity()


def test_integrity_catches_corruption():
    bm = BlockManager(8, BS)
    s = seq(range(1, 10))
    bm.allocate(s)
    bm.blocks[s.block_table[0]].ref_count += 1
    with pytest.raises(IntegrityError, match="ref"):
        bm.check_integrity()
    bm.blocks[s.block_table[0]].ref_count -= 1
    bm.blocks[s.block_table[1]].hash = b"x" * 16
    with pytest.raises(IntegrityError):
        bm.check_integrity()


def test_allocate_twice_is_an_error():
    bm = BlockManager(8, BS)
    s = seq([1, 2])
    bm.allocate(s)
    with pytest.raises(RuntimeError, match="already holds"):
        bm.allocate(s)


def test_random_soak_keeps_integrity():
    rng = random.Random(1234)
    bm = BlockManager(24, BS)
    live = []
    for _ in range(3000):
        op = rng.random()
        if op < 0.3:
            s = seq([rng.randrange(3) for _ in range(rng.randrange(1, 30))])
            n = s.num_tokens - bm.num_cached_prefix_tokens(s)
            if bm.can_allocate(s, n):
                bm.allocate(s, n)
                live.append(s)
        elif op < 0.7 and live:
            s = rng.choice(live)
            n = rng.randrange(0, s.num_tokens - s.num_computed_tokens + 1)
            if bm.can_append(s, n):
                bm.append_slots(s, n)
                s.num_computed_tokens += n
                bm.cache_computed_blocks(s)
                if s.num_computed_tokens == s.num_tokens:
                    s.reserve_token()
                    s.resolve_token(rng.randrange(3))
        elif live:
            bm.free(live.pop(rng.randrange(len(live))))
        bm.check_integrity()
    assert bm.stats.hits > 0 and bm.stats.evictions > 0


def test_allocate_rejects_more_tokens_than_the_sequence_has():
    bm = BlockManager(8, BS)
    with pytest.raises(ValueError, match="outside"):
        bm.allocate(seq([1, 2, 3]), 4)
