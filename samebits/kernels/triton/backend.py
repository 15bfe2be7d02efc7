"""The deterministic backend on CUDA (the table's ("deterministic", "cuda") row): the Triton kernels of this folder,
and for linears whose weight shape passed its self-test the proven cuBLASLt route (kernels/vendor_gemm.py)."""
from __future__ import annotations

from samebits.kernels import common, fp8, kv_cache, moe, vendor_fp8, vendor_gemm
from samebits.kernels import rope as torch_rope
from samebits.kernels.attention import run_checked
from samebits.kernels.triton import activation as tri_activation
from samebits.kernels.triton import attention as tri_attention
from samebits.kernels.triton import fp8 as tri_fp8
from samebits.kernels.triton import matmul as tri_matmul
from samebits.kernels.triton import moe as tri_moe
from samebits.kernels.triton import norms, reduce
from samebits.kernels.triton import softmax as tri_softmax
from samebits.kernels.triton.kv_write import write_kv as tri_write_kv
from samebits.kernels.triton.philox import philox_uniforms  # noqa: F401 - an op of this backend (ops.OPS)
from samebits.kernels.triton.race import gumbel_race  # noqa: F401
from samebits.kernels.triton.rope import apply_rope as tri_rope
from samebits.kernels.triton.rope import rope_write_kv as tri_rope_write_kv


def linear(x, weight, bias=None):
    """x [..., K], weight [N, K], bias [N] or None -> [..., N] in x.dtype."""
    common.check_linear(x, weight, bias)
    x2 = x.reshape(-1, x.shape[-1])
    if vendor_gemm.eligible(x2, weight, bias):
        return vendor_gemm.lt_linear(x2, weight).reshape(*x.shape[:-1], weight.shape[0])
    return tri_matmul.linear(x, weight, bias)


def linear_fp8(x, weight, scale, recipe, input_scale=None, bias=None):
    """x [..., K], weight [N, K] e4m3 with its scales (kernels/fp8.py) -> [..., N] in x.dtype; the per-tensor dynamic
    recipe refused. The proven vendor GEMM where its self-test passed for the shape, else the Triton kernels."""
    fp8.check_linear_fp8(x, weight, scale, recipe, input_scale, bias)
    fp8.refuse_variant(recipe, "linear_fp8")
    x2 = x.reshape(-1, x.shape[-1])
    if vendor_fp8.eligible(x2, weight, recipe, bias):
        return vendor_fp8.linear(x2, weight, scale, recipe, input_scale).reshape(*x.shape[:-1], weight.shape[0])
    return tri_fp8.linear_fp8(x, weight, scale, recipe, input_scale, bias)


def linear_partials(x, weights):
    """x [M, C*Kc], weights [C, N, Kc] -> float32 [C, M, N]: one Triton matmul per K chunk with a float32 output, so
    each chunk's sum is the canonical kernel's (K in sequence, BK steps) and nothing is rounded before the merge."""
    common.check_linear_partials(x, weights)
    return tri_matmul.linear_partials(x, weights)


def matmul(a, b):
    """a [M, K] @ b [K, N] -> [M, N] in a.dtype."""
    common.check_matmul(a, b)
    return tri_matmul.matmul(a, b)


def bmm(a, b):
    """a [B, M, K] @ b [B, K, N]: one invariant matmul per batch entry, so an entry never shares a launch with another's
    rows."""
    return common.per_entry(matmul, a, b)


def rms_norm(x, weight, eps):
    common.check_rms_norm(x, weight)
    return norms.rms_norm(x, weight, eps)


def add_rms_norm(x, residual, weight, eps):
    common.check_add_rms_norm(x, residual, weight)
    return norms.add_rms_norm(x, residual, weight, eps)


def softmax(x, dim=-1):
    common.require("softmax", x)
    return tri_softmax.softmax(x, dim)


def log_softmax(x, dim=-1):
    common.require("log_softmax", x)
    return tri_softmax.log_softmax(x, dim)


def silu_and_mul(x):
    """Elementwise in fp32, one fused pass with the bits of the torch form (kernels/activation.py)."""
    common.require("silu_and_mul", x)
    return tri_activation.silu_and_mul(x)


def det_sum_rows(x):
    common.require("det_sum_rows", x)
    return reduce.det_sum_rows(x)


def rope(q, k, positions, cos_sin):
    torch_rope.check(q, k, positions, cos_sin)
    if not q.shape[0]:
        return torch_rope.apply_rope(q, k, positions, cos_sin)  # nothing to launch
    return tri_rope(q, k, positions, cos_sin)


def write_kv(k, v, k_cache, v_cache, slot_mapping) -> None:
    kv_cache.check(k, v, k_cache, v_cache, slot_mapping)
    if k.shape[0]:
        tri_write_kv(k, v, k_cache, v_cache, slot_mapping)


def rope_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping):
    """rope then write_kv in one launch (a layer's two smallest kernels): the same bits (tests/kernels/triton)."""
    torch_rope.check(q, k, positions, cos_sin)
    kv_cache.check(k, v, k_cache, v_cache, slot_mapping)
    if not q.shape[0]:
        return torch_rope.rope_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping)
    return tri_rope_write_kv(q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping)


def _fixed_tiles(q, k_cache, v_cache, meta, scale):
    return tri_attention.paged_attention(q, k_cache, v_cache, meta, scale, parallel_splits=None)


def attention(q, k_cache, v_cache, meta, scale):
    return run_checked(_fixed_tiles, "deterministic", q, k_cache, v_cache, meta, scale,
                       head_dims=tri_attention.HEAD_DIMS)


def moe_topk(scores, k):
    """The k highest scores per row, ties to the lower expert index (an exact order: kernels/moe.py)."""
    common.require("moe_topk", scores)
    return moe.topk_ids(scores, k)


def moe_experts(x, w13, w2, ids, weights):
    """Tokens sorted by expert, gate/up + SiLU and down in fixed K order, rank-order combine (triton/moe.py)."""
    common.require("moe_experts", x, w13, w2)
    return tri_moe.fused_experts(x, w13, w2, ids, weights)
