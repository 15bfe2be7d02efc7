"""`TrainOps`: the engine's ops table with a backward, so the trainer runs the engine's own forward under autograd.

Every op is one `torch.autograd.Function` whose forward calls the invariant op of the engine's `Ops` (the very kernels
that computed the rollout, so the trainer's logprobs are the rollout's bits). Two backwards:

- fused (deterministic mode's): the model's ops (linear, the norms, SiLU·mul, RoPE, attention, log_softmax) save what
  their forward computed and call the backward ops of their device (kernels/grads.py: Triton on CUDA, torch forms
  on the CPU), each with its order written down: the linears' gradients are the invariant matmul (a weight's over
  the packed tokens as K), norm and bias weights' sums over fixed token splits merged in order, attention two
  FlashAttention-2 passes without a float atomic. RoPE's backward is the engine's RoPE with the opposite angle.
- reference (fast mode's, and the other ops': matmul, bmm, softmax, det_sum_rows): `_Recompute` recomputes the op in
  plain torch (rl/reference.py) and lets autograd differentiate it.

Either way the forward's bits are the engine's, and a gradient's bits are a function of the packed batch alone.

Attention is the one op that reads its keys and values from the paged cache rather than from its arguments: the
model calls `rope_write_kv` and then `attention` per layer (models/llama.py), so its `write_kv` stores detached copies
in the cache and keeps the differentiable k and v for the `attention` call on the same cache that follows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from samebits.kernels.grads import get_grads
from samebits.kernels.ops import Ops
from samebits.rl import reference

BACKWARDS = ("fused", "reference")


@dataclass(frozen=True)
class OpPair:
    forward: Callable  # the invariant op: its bits are the forward's
    reference: Callable  # the same math in plain torch: its gradient is the backward


class _Recompute(torch.autograd.Function):
    """forward(op, consts, *tensors) = op.forward(*tensors, *consts); backward = the vjp of op.reference there."""

    @staticmethod
    def forward(ctx, op: OpPair, consts: tuple, *tensors):
        ctx.op, ctx.consts = op, consts
        ctx.save_for_backward(*tensors)
        return op.forward(*tensors, *consts)

    @staticmethod
    def backward(ctx, *grads):
        inputs = [t if t is None else t.detach().requires_grad_(need)
                  for t, need in zip(ctx.saved_tensors, ctx.needs_input_grad[2:])]
        wanted = [t for t in inputs if t is not None and t.requires_grad]
        if not wanted:
            return (None, None, *[None] * len(inputs))
        with torch.enable_grad():
            outs = ctx.op.reference(*inputs, *ctx.consts)
        outs = outs if isinstance(outs, tuple) else (outs,)
        pairs = [(o, g) for o, g in zip(outs, grads) if o.requires_grad and g is not None]
        found = iter(torch.autograd.grad([o for o, _ in pairs], wanted, [g for _, g in pairs], allow_unused=True))
        return (None, None, *[next(found) if t is not None and t.requires_grad else None for t in inputs])


def _apply(op: OpPair, tensors: tuple, consts: tuple = ()):
    return _Recompute.apply(op, consts, *tensors)


class _Linear(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ops, x, weight, bias):
        ctx.grads, ctx.has_bias = ops.grads, bias is not None
        ctx.save_for_backward(x, weight)
        return ops.base.linear(x, weight, bias)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        need_x, need_w, need_b = ctx.needs_input_grad[1:4]
        dx = ctx.grads.linear_dx(dy, weight) if need_x else None
        dw = ctx.grads.linear_dw(dy, x) if need_w else None
        db = ctx.grads.bias_grad(dy) if ctx.has_bias and need_b else None
        return None, dx, dw, db


class _RmsNorm(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ops, x, weight, eps):
        ctx.grads, ctx.eps = ops.grads, eps
        ctx.save_for_backward(x, weight)
        return ops.base.rms_norm(x, weight, eps)

    @staticmethod
    def backward(ctx, dy):
        x, weight = ctx.saved_tensors
        dx, dw = ctx.grads.rms_norm_bwd(dy, x, weight, ctx.eps)
        return None, dx, dw, None


class _AddRmsNorm(torch.autograd.Function):
    """(rms_norm(x + residual), x + residual): the sum is saved (it is the residual stream, kept anyway), and the
    gradient reaching it directly joins the norm's own inside the backward kernel."""

    @staticmethod
    def forward(ctx, ops, x, residual, weight, eps):
        ctx.grads, ctx.eps = ops.grads, eps
        ctx.set_materialize_grads(False)
        normed, total = ops.base.add_rms_norm(x, residual, weight, eps)
        ctx.save_for_backward(total, weight)
        return normed, total

    @staticmethod
    def backward(ctx, dy, dtotal):
        total, weight = ctx.saved_tensors
        dy = torch.zeros_like(total) if dy is None else dy
        dx, dw = ctx.grads.rms_norm_bwd(dy, total, weight, ctx.eps, dtotal)
        return None, dx, dx, dw, None


class _SiluAndMul(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ops, x):
        ctx.grads = ops.grads
        ctx.save_for_backward(x)
        return ops.base.silu_and_mul(x)

    @staticmethod
    def backward(ctx, dy):
        (x,) = ctx.saved_tensors
        return None, ctx.grads.silu_and_mul_bwd(dy, x)


class _Rope(torch.autograd.Function):
    """A rotation's transpose is the rotation by the opposite angle: the backward is the engine's own RoPE op over the
    output gradients with sin negated (TrainOps.reverse_table)."""

    @staticmethod
    def forward(ctx, ops, q, k, positions, cos_sin):
        ctx.base, ctx.reverse = ops.base, ops.reverse_table(cos_sin)
        ctx.save_for_backward(positions)
        return ops.base.rope(q, k, positions, cos_sin)

    @staticmethod
    def backward(ctx, dq, dk):
        (positions,) = ctx.saved_tensors
        dq, dk = ctx.base.rope(dq.contiguous(), dk.contiguous(), positions, ctx.reverse)
        return None, dq, dk, None, None


class _Attention(torch.autograd.Function):
    @staticmethod
    def forward(ctx, ops, q, k, v, k_cache, v_cache, meta, scale):
        ctx.grads, ctx.meta, ctx.scale = ops.grads, meta, scale
        out = ops.base.attention(q, k_cache, v_cache, meta, scale)
        ctx.save_for_backward(q, k, v, out)
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out = ctx.saved_tensors
        meta = ctx.meta
        dq, dk, dv = ctx.grads.attention_bwd(q, k, v, out, dout.contiguous(), meta.cu_seqlens_q, meta.max_query_len,
                                             ctx.scale)
        return None, dq, dk, dv, None, None, None, None


class _LogSoftmax(torch.autograd.Function):
    """log_softmax over the last dim of [R, V]: dx = dy - exp(y) * sum(dy), the row sum the invariant one."""

    @staticmethod
    def forward(ctx, ops, x):
        ctx.base, ctx.dtype = ops.base, x.dtype
        y = ops.base.log_softmax(x, -1)
        ctx.save_for_backward(y)
        return y

    @staticmethod
    def backward(ctx, dy):
        (y,) = ctx.saved_tensors
        dx = dy - torch.exp(y) * ctx.base.det_sum_rows(dy)[:, None]
        return None, dx.to(ctx.dtype)


class TrainOps:
    """The op set of `Ops` (kernels/ops.py OPS), differentiable; forward bits are `base`'s. `backward`: "fused"
    (deterministic mode's default) or "reference" (fast mode's)."""

    def __init__(self, base: Ops, backward: str | None = None):
        self.base = base
        self.mode, self.device, self.deterministic = base.mode, base.device, base.deterministic
        self.backward = backward or ("fused" if base.deterministic else "reference")
        if self.backward not in BACKWARDS:
            raise ValueError(f"TrainOps: backward must be one of {BACKWARDS}, got {self.backward!r}")
        self.fused = self.backward == "fused"
        self.grads = get_grads(base.device) if self.fused else None
        self._pairs = {name: OpPair(getattr(base, name), getattr(reference, name))
                       for name in ("linear", "matmul", "bmm", "rms_norm", "add_rms_norm", "softmax", "log_softmax",
                                    "silu_and_mul", "det_sum_rows", "rope", "moe_experts")}
        self._attention = OpPair(self._cached_attention, self._reference_attention)
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._reverse: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self._checked_meta = None
        self.philox_uniforms = base.philox_uniforms  # integer arithmetic: nothing to differentiate
        self.gumbel_race = base.gumbel_race  # a token id: nothing to differentiate
        self.moe_topk = base.moe_topk  # expert ids: nothing to differentiate (the weights are gathered after it)

    def __repr__(self) -> str:
        return f"TrainOps({self.base!r}, backward={self.backward!r})"

    def linear(self, x, weight, bias=None):
        if self.fused:
            return _Linear.apply(self, x, weight, bias)
        return _apply(self._pairs["linear"], (x, weight, bias))

    def matmul(self, a, b):
        return _apply(self._pairs["matmul"], (a, b))

    def bmm(self, a, b):
        return _apply(self._pairs["bmm"], (a, b))

    def rms_norm(self, x, weight, eps):
        if self.fused:
            return _RmsNorm.apply(self, x, weight, eps)
        return _apply(self._pairs["rms_norm"], (x, weight), (eps,))

    def add_rms_norm(self, x, residual, weight, eps):
        if self.fused:
            return _AddRmsNorm.apply(self, x, residual, weight, eps)
        return _apply(self._pairs["add_rms_norm"], (x, residual, weight), (eps,))

    def softmax(self, x, dim=-1):
        return _apply(self._pairs["softmax"], (x,), (dim,))

    def log_softmax(self, x, dim=-1):
        if self.fused and x.dim() == 2 and dim in (-1, 1):
            return _LogSoftmax.apply(self, x)
        return _apply(self._pairs["log_softmax"], (x,), (dim,))

    def silu_and_mul(self, x):
        if self.fused:
            return _SiluAndMul.apply(self, x)
        return _apply(self._pairs["silu_and_mul"], (x,))

    def det_sum_rows(self, x):
        return _apply(self._pairs["det_sum_rows"], (x,))

    def moe_experts(self, x, w13, w2, ids, weights):
        return _apply(self._pairs["moe_experts"], (x, w13, w2, ids, weights))

    def rope(self, q, k, positions, cos_sin):
        if self.fused:
            return _Rope.apply(self, q, k, positions, cos_sin)
        return _apply(self._pairs["rope"], (q, k, positions, cos_sin))

    def reverse_table(self, cos_sin: torch.Tensor) -> torch.Tensor:
        """cos_sin with sin negated (the rotation by minus each angle), made once per table."""
        key = id(cos_sin)
        have = self._reverse.get(key)
        if have is None or have[0] is not cos_sin:
            half = cos_sin.shape[1] // 2
            have = self._reverse[key] = (cos_sin, torch.cat([cos_sin[:, :half], -cos_sin[:, half:]], 1).contiguous())
        return have[1]

    def write_kv(self, k, v, k_cache, v_cache, slot_mapping) -> None:
        self.base.write_kv(k.detach(), v.detach(), k_cache, v_cache, slot_mapping)
        self._pending[id(k_cache)] = (k, v)

    def rope_write_kv(self, q, k, v, positions, cos_sin, k_cache, v_cache, slot_mapping):
        """The unfused pair: a differentiable rope, then write_kv keeping k and v for attention. The base's fused
        op gives these bits (tests/kernels/triton/test_rope.py)."""
        q, k = self.rope(q, k, positions, cos_sin)
        self.write_kv(k, v, k_cache, v_cache, slot_mapping)
        return q

    def attention(self, q, k_cache, v_cache, meta, scale):
        pending = self._pending.pop(id(k_cache), None)
        if pending is None:
            raise RuntimeError("TrainOps.attention: no write_kv into this cache came first (the model writes a "
                               "layer's keys and values, then attends over them)")
        k, v = pending
        if not self.fused:
            return _apply(self._attention, (q, k, v), (k_cache, v_cache, meta, scale))
        if self._checked_meta is not meta:
            reference.check_whole_sequences(meta)
            self._checked_meta = meta
        return _Attention.apply(self, q, k, v, k_cache, v_cache, meta, scale)

    def _cached_attention(self, q, k, v, k_cache, v_cache, meta, scale):
        return self.base.attention(q, k_cache, v_cache, meta, scale)

    @staticmethod
    def _reference_attention(q, k, v, k_cache, v_cache, meta, scale):
        return reference.causal_attention(q, k, v, meta, scale)
