"""Reference torch math of every op the model runs: what the trainer's backward differentiates (rl/train_ops.py).

Each function computes what the invariant op of the same name computes, in plain torch ops that autograd knows, so
its gradient is the op's gradient; its bits may differ from the op's (it is only ever differentiated, never used as
a forward). The norms and softmaxes are the fast backend's (kernels/vendor.py); RoPE is the torch op of
kernels/rope.py, silu_and_mul that of kernels/activation.py; attention is spelled out per sequence, dense and causal,
because the trainer's batches are whole sequences (no cached prefix).
"""
from __future__ import annotations

import itertools

import torch
import torch.nn.functional as F

from samebits.kernels import moe, vendor
from samebits.kernels.activation import silu_and_mul  # the op's torch form (plain autograd ops)
from samebits.kernels.rope import apply_rope

linear = F.linear
matmul = torch.mm
bmm = torch.bmm
rms_norm = vendor.rms_norm
add_rms_norm = vendor.add_rms_norm
softmax = vendor.softmax
log_softmax = vendor.log_softmax
rope = apply_rope


def moe_experts(x, w13, w2, ids, weights):
    """One expert at a time in plain torch (kernels/moe.py's definition of the op)."""
    return moe.experts_by_loop(x, w13, w2, ids, weights, F.linear, silu_and_mul)


def det_sum_rows(x):
    return x.float().sum(-1)


def causal_attention(q, k, v, meta, scale: float):
    """q [T, Hq, D], k and v [T, Hkv, D] of whole sequences packed by meta.cu_seqlens_q -> [T, Hq, D] in q.dtype."""
    cu, ctx = meta.cu_seqlens_q.tolist(), meta.context_lens.tolist()
    if any(cu[b + 1] - cu[b] != n for b, n in enumerate(ctx)):
        raise ValueError("the trainer's attention needs whole sequences: every query_len must equal its context_len")
    g = q.shape[1] // k.shape[1]
    outs = []
    for q0, q1 in itertools.pairwise(cu):
        qs = q[q0:q1].float()
        ks = k[q0:q1].float().repeat_interleave(g, dim=1)
        vs = v[q0:q1].float().repeat_interleave(g, dim=1)
        s = torch.einsum("thd,shd->hts", qs, ks) * scale
        future = torch.ones(q1 - q0, q1 - q0, dtype=torch.bool, device=q.device).triu(1)
        p = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)
        outs.append(torch.einsum("hts,shd->thd", p, vs).to(q.dtype))
    return torch.cat(outs) if outs else torch.empty_like(q)
