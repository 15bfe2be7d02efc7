"""The fast backend: the vendor's torch ops, whose blocking follows the shapes (not batch-invariant), on the CPU; the
CUDA row (triton/fast.py) takes its GEMMs, softmax and reductions, and Triton's attention, norms and activation."""
from __future__ import annotations

import torch
import torch.nn.functional as F

from samebits.kernels.attention import paged_attention_sdpa, run_checked
from samebits.kernels.fp8 import dequantized_linear as linear_fp8  # noqa: F401 - an op of this backend (ops.OPS)
from samebits.kernels.kv_cache import write_kv  # noqa: F401 - ops of this backend (ops.OPS), shared with the CPU's
from samebits.kernels.philox import philox_uniforms  # noqa: F401
from samebits.kernels.race import gumbel_race  # noqa: F401
from samebits.kernels.rope import apply_rope as rope  # noqa: F401
from samebits.kernels.rope import rope_write_kv  # noqa: F401

linear = F.linear
matmul = torch.mm
bmm = torch.bmm


def linear_partials(x, weights):
    """x [M, C*Kc], weights [C, N, Kc] -> float32 [C, M, N], per-chunk partial sums of x @ W^T: one torch.bmm (the
    reference the deterministic backends' versions are checked against)."""
    c, _, kc = weights.shape
    chunks = x.float().reshape(x.shape[0], c, kc).transpose(0, 1)
    return torch.bmm(chunks, weights.float().transpose(1, 2))


def rms_norm(x, w, eps):
    # torch's own normalisation (one fused kernel on CUDA, where the spelled-out form took six), rounded to x.dtype,
    # then the weight in x.dtype: HF Llama's semantics, as the deterministic backends compute them.
    return F.rms_norm(x, (x.shape[-1],), eps=eps) * w.to(x.dtype)


def add_rms_norm(x, residual, w, eps):
    s = x + residual
    return rms_norm(s, w, eps), s


def softmax(x, dim=-1):
    return torch.softmax(x, dim, dtype=torch.float32)


def log_softmax(x, dim=-1):
    return torch.log_softmax(x, dim, dtype=torch.float32)


def silu_and_mul(x):
    i = x.shape[-1] // 2
    return F.silu(x[..., :i]) * x[..., i:]


def det_sum_rows(x):
    """x [R, n] -> [R] fp32 sums in torch's order (named as the deterministic op it stands in for)."""
    return x.float().sum(-1)


def attention(q, k_cache, v_cache, meta, scale):
    return run_checked(paged_attention_sdpa, "fast", q, k_cache, v_cache, meta, scale)


def moe_topk(scores, k):
    return torch.topk(scores, k, dim=-1).indices


def moe_experts(x, w13, w2, ids, weights):
    """transformers' loop: each expert's tokens through F.linear, weighted, summed into the output by index_add_ in
    expert order (float atomics on CUDA; a GEMM of as many rows as the expert got)."""
    out = torch.zeros_like(x)
    inter = w2.shape[2]
    for e in ids.unique().tolist():
        tokens, ranks = torch.where(ids == e)
        h = F.linear(x[tokens], w13[e])
        y = F.linear(F.silu(h[:, :inter]) * h[:, inter:], w2[e]) * weights[tokens, ranks, None]
        # samebits: intentionally nondeterministic because this is fast mode's transformers loop, the baseline of the
        # tax (on the CPU, where index_add_ runs in order; the CUDA fast row takes grouped_experts).
        out.index_add_(0, tokens, y.to(x.dtype))
    return out


def grouped_experts(x, w13, w2, ids, weights):
    """The experts as a vendor grouped GEMM (torch._grouped_mm, bf16): pairs sorted by expert, one GEMM call over all
    experts per projection, no host sync; the k outputs summed by torch. CUDA fast mode's route (triton/fast.py)."""
    t, k = ids.shape
    inter = w2.shape[2]
    flat = ids.reshape(-1)
    order = flat.argsort()
    ends = torch.searchsorted(flat.index_select(0, order), torch.arange(1, w13.shape[0] + 1, device=x.device))
    xs = x.index_select(0, order // k)
    h = torch._grouped_mm(xs, w13.transpose(1, 2), offs=ends.to(torch.int32))
    h = F.silu(h[:, :inter]) * h[:, inter:]
    y = torch._grouped_mm(h, w2.transpose(1, 2), offs=ends.to(torch.int32))
    unsorted = torch.empty_like(y).index_copy_(0, order, y)
    return (unsorted.view(t, k, -1) * weights[..., None].to(x.dtype)).sum(1)
