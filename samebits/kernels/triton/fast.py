"""The fast backend on CUDA (the table's ("fast", "cuda") row): the vendor's torch ops, and the Triton attention block,
which is at least as fast as per-sequence SDPA where it has a tile (SDPA serves the other head dims)."""
from __future__ import annotations

from samebits.kernels.attention import paged_attention_sdpa, run_checked
from samebits.kernels.triton import attention as tri_attention
from samebits.kernels.triton.backend import gumbel_race, philox_uniforms, rope, write_kv  # noqa: F401 - ops of this backend
from samebits.kernels.vendor import (  # noqa: F401
    add_rms_norm,
    bmm,
    det_sum_rows,
    linear,
    linear_partials,
    log_softmax,
    matmul,
    rms_norm,
    silu_and_mul,
    softmax,
)


def _attend(q, k_cache, v_cache, meta, scale):
    if q.shape[2] in tri_attention.HEAD_DIMS:
        return tri_attention.paged_attention(q, k_cache, v_cache, meta, scale, parallel_splits=None)
    return paged_attention_sdpa(q, k_cache, v_cache, meta, scale)


def attention(q, k_cache, v_cache, meta, scale):
    return run_checked(_attend, "fast", q, k_cache, v_cache, meta, scale)
