"""The fast backend on CUDA (the table's ("fast", "cuda") row): the vendor's GEMMs, softmax and reductions, whose
blocking follows the shapes (not batch-invariant), and the Triton kernels where an op has no reduction across rows to
reorder: the attention block (at least as fast as per-sequence SDPA where it has a tile; SDPA serves the other head
dims), the fused norms and silu_and_mul: one launch each where torch's forms take two or three (docs/results/HISTORY.md
§8 has what that cost at batch 256). Experts: torch's grouped GEMM (CUTLASS, bf16 on Hopper) with torch.topk's
routing, else the fused Triton kernels."""
from __future__ import annotations

import torch

from samebits.kernels import vendor
from samebits.kernels.attention import paged_attention_sdpa, run_checked
from samebits.kernels.triton import attention as tri_attention
from samebits.kernels.triton import moe as tri_moe
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
    moe_topk,
    softmax,
)
from samebits.kernels.vendor_fp8 import fast_linear as linear_fp8  # noqa: F401 - an op of this backend


def _attend(q, k_cache, v_cache, meta, scale):
    if q.shape[2] in tri_attention.HEAD_DIMS:
        return tri_attention.paged_attention(q, k_cache, v_cache, meta, scale, parallel_splits=None)
    return paged_attention_sdpa(q, k_cache, v_cache, meta, scale)


def attention(q, k_cache, v_cache, meta, scale):
    return run_checked(_attend, "fast", q, k_cache, v_cache, meta, scale)


_GROUPED_MM: dict[int, bool] = {}  # device index -> torch's grouped GEMM ran here


def _grouped_mm(index: int) -> bool:
    """Hopper, and a small grouped GEMM ran (tried eagerly, at the first call outside a capture): else the Triton
    kernels serve fast mode too."""
    if index not in _GROUPED_MM:
        if torch.cuda.is_current_stream_capturing():
            return False
        _GROUPED_MM[index] = hasattr(torch, "_grouped_mm") and \
            torch.cuda.get_device_capability(index) >= (9, 0) and _grouped_mm_runs(torch.device("cuda", index))
    return _GROUPED_MM[index]


def _grouped_mm_runs(device) -> bool:
    w13 = torch.ones(4, 64, 64, dtype=torch.bfloat16, device=device)
    ids = torch.tensor([[0, 2], [2, 1], [0, 2]], device=device)  # groups of 2, 1, 3 and 0 rows
    try:
        vendor.grouped_experts(w13[0, :3], w13, w13[:, :, :32], ids, torch.ones(3, 2, device=device))
        torch.cuda.synchronize(device)
    except RuntimeError:
        return False
    return True


def moe_experts(x, w13, w2, ids, weights):
    index = x.device.index if x.device.index is not None else torch.cuda.current_device()
    if x.dtype == torch.bfloat16 and ids.numel() and _grouped_mm(index):
        return vendor.grouped_experts(x, w13, w2, ids, weights)
    return tri_moe.fused_experts(x, w13, w2, ids, weights)
