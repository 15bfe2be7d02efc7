"""The Triton KV write against the torch op (kernels.kv_cache.write_kv): interpreter here, native on a GPU."""
from __future__ import annotations

import pytest
import torch

from samebits.kernels.kv_cache import write_kv
from samebits.probe.compare import assert_same_bits
from tests.kernels.helpers import fresh_generator, rand

pytestmark = pytest.mark.interpreter
kv_write = pytest.importorskip("samebits.kernels.triton.kv_write")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def test_write_kv_kernel_matches_reference(seed):
    caches = [torch.zeros(4, 4, 2, 64, dtype=torch.bfloat16, device=DEVICE) for _ in range(4)]
    kv = rand((6, 2, 2, 64), torch.bfloat16, fresh_generator(seed), DEVICE)  # k and v as strided views of one tensor
    slots = torch.tensor([9, 3, -1, 15, 4, 8], device=DEVICE)
    kv_write.write_kv(kv[:, 0], kv[:, 1], caches[0], caches[1], slots)
    write_kv(kv[:, 0], kv[:, 1], caches[2], caches[3], slots)
    assert_same_bits(caches[0], caches[2], "k cache")
    assert_same_bits(caches[1], caches[3], "v cache")
