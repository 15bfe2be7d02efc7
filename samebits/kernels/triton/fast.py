"""The fast backend on CUDA (the table's ("fast", "cuda") row): the vendor's GEMMs, softmax and reductions, whose
blocking follows the shapes (not batch-invariant), and the Triton kernels where an op has no reduction across rows to
reorder: the attention block (at least as fast as per-sequence SDPA where it has a tile; SDPA serves the other head
dims), the fused norms and silu_and_mul: one launch each where torch's forms take two or three (docs/BENCHMARKS.md
section 8 has what that cost at batch 256)."""
from __future__ import annotations

from samebits.kernels.attention import paged_attention_sdpa, run_checked
from samebits.kernels.triton import attention as tri_attention
from samebits.kernels.triton.backend import (  # noqa: F401 - ops of this backend
    add_rms_norm,
    gumbel_race,
    philox_uniforms,
    rms_norm,
    rope,
    rope_write_kv,
    silu_and_mul,
    write_kv,
)
from samebits.kernels.vendor import (  # noqa: F401
    bmm,
    det_sum_rows,
    linear,
    linear_partials,
    log_softmax,
    matmul,
    softmax,
)
from samebits.kernels.vendor_fp8 import fast_linear as linear_fp8  # noqa: F401 - an op of this backend


def _attend(q, k_cache, v_cache, meta, scale):
    if q.shape[2] in tri_attention.HEAD_DIMS:
        return tri_attention.paged_attention(q, k_cache, v_cache, meta, scale, parallel_splits=None)
    return paged_attention_sdpa(q, k_cache, v_cache, meta, scale)


def attention(q, k_cache, v_cache, meta, scale):
    return run_checked(_attend, "fast", q, k_cache, v_cache, meta, scale)
