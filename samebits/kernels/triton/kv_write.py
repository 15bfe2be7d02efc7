"""Triton KV cache write: a copy per token, so batch-invariant by construction; it exists so the GPU path needs no
index_copy_ (whose CUDA implementation may use atomics for duplicate indices). Torch reference: kernels.kv_cache.
"""
from __future__ import annotations

import triton
import triton.language as tl

from samebits.kernels.triton.attention import FP_FUSION


@triton.jit
def _copy_row(SRC, DST, n, BLOCK: tl.constexpr):
    # n contiguous elements of SRC to DST (BLOCK >= n).
    i = tl.arange(0, BLOCK)
    ok = i < n
    tl.store(DST + i, tl.load(SRC + i, mask=ok), mask=ok)


@triton.jit
def _write_kv_kernel(K, V, KC, VC, slots, stride_kt, stride_vt, HD: tl.constexpr, BLOCK: tl.constexpr):
    # grid (T,): token t's [Hkv * D] keys/values copied to cache row `slots[t]` ([NB * BS, Hkv * D] view).
    t = tl.program_id(0)
    slot = tl.load(slots + t)
    if slot >= 0:
        _copy_row(K + t * stride_kt, KC + slot * HD, HD, BLOCK)
        _copy_row(V + t * stride_vt, VC + slot * HD, HD, BLOCK)


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    t, h, d = k.shape
    what = f"write_kv[triton](k {tuple(k.shape)} strides {k.stride()}, v strides {v.stride()})"
    assert k.stride(2) == 1 and k.stride(1) == d and v.stride(2) == 1 and v.stride(1) == d, \
        f"{what}: each token's [Hkv, D] must be contiguous"
    assert slot_mapping.device == k.device, f"{what}: slot_mapping must be on {k.device}"
    _write_kv_kernel[(t,)](k, v, k_cache, v_cache, slot_mapping.long(), k.stride(0), v.stride(0),
                           HD=h * d, BLOCK=triton.next_power_of_2(h * d), enable_fp_fusion=FP_FUSION)
