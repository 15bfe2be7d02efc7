"""The paged KV store: layout, slot addressing, padding slots."""
from __future__ import annotations

import pytest
import torch

from samebits.kernels import get_ops
from samebits.kernels.attention import AttentionMetadata
from samebits.kernels.kv_cache import allocate_kv_cache, write_kv
from samebits.modes import MODES
from samebits.probe.compare import assert_same_bits
from tests.kernels.helpers import fresh_generator, rand


def test_allocate_shapes():
    caches = allocate_kv_cache(3, 10, 16, 2, 64, torch.bfloat16, "cpu")
    assert len(caches) == 3
    for k, v in caches:
        assert k.shape == v.shape == (10, 16, 2, 64) and k.dtype == torch.bfloat16
        assert k.data_ptr() != v.data_ptr() and not k.any()


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_write_places_each_token_at_its_slot(dtype, seed):
    g, bs = fresh_generator(seed), 4
    (k_cache, v_cache), = allocate_kv_cache(1, 8, bs, 2, 64, dtype, "cpu")
    meta = AttentionMetadata.build([3, 2], [6, 2], [[5, 1], [6]], bs)
    k, v = rand((5, 2, 64), dtype, g), rand((5, 2, 64), dtype, g)
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    # seq 0 positions 3, 4, 5 -> block 5 offset 3, block 1 offsets 0, 1; seq 1 positions 0, 1 -> block 6 offsets 0, 1
    for i, (blk, off) in enumerate([(5, 3), (1, 0), (1, 1), (6, 0), (6, 1)]):
        assert_same_bits(k_cache[blk, off], k[i], f"k token {i}")
        assert_same_bits(v_cache[blk, off], v[i], f"v token {i}")
    assert int((k_cache != 0).any(-1).any(-1).sum()) == 5


def test_negative_slots_are_padding(seed):
    (k_cache, v_cache), = allocate_kv_cache(1, 2, 4, 1, 64, torch.float32, "cpu")
    k = rand((3, 1, 64), torch.float32, fresh_generator(seed))
    write_kv(k, k, k_cache, v_cache, torch.tensor([2, -1, 5]))
    assert_same_bits(k_cache.view(8, 1, 64)[[2, 5]], k[[0, 2]], "written rows")
    assert int((k_cache != 0).any(-1).sum()) == 2


def test_mismatched_inputs_fail_loud():
    (k_cache, v_cache), = allocate_kv_cache(1, 2, 4, 1, 64, torch.float32, "cpu")
    with pytest.raises(TypeError, match="dtype"):
        write_kv(torch.zeros(1, 1, 64).half(), torch.zeros(1, 1, 64).half(), k_cache, v_cache, torch.tensor([0]))
    with pytest.raises(ValueError, match="slot_mapping"):
        write_kv(torch.zeros(2, 1, 64), torch.zeros(2, 1, 64), k_cache, v_cache, torch.tensor([0]))


@pytest.mark.parametrize("mode", MODES)
def test_the_cpu_backends_write_through_the_reference(mode, seed):
    g = fresh_generator(seed)
    caches = [allocate_kv_cache(1, 4, 4, 2, 64, torch.bfloat16, "cpu")[0] for _ in range(2)]
    k, v = rand((6, 2, 64), torch.bfloat16, g), rand((6, 2, 64), torch.bfloat16, g)
    slots = torch.tensor([9, 3, 0, 15, 4, 8])
    get_ops(mode, "cpu").write_kv(k, v, *caches[0], slots)
    write_kv(k, v, *caches[1], slots)
    assert_same_bits(caches[0][0], caches[1][0], "k cache")
    assert_same_bits(caches[0][1], caches[1][1], "v cache")
