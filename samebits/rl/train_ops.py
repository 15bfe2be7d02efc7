"""`TrainOps`: the engine's ops table with a backward, so the trainer runs the engine's own forward under autograd.

Every op is one `torch.autograd.Function` (`_Recompute`): its forward calls the invariant op of the engine's `Ops`
(the very kernels that computed the rollout, so the trainer's logprobs are the rollout's bits), its backward
recomputes the op in reference torch math (rl/reference.py) and lets autograd differentiate that. The backward never
depends on the forward's bits beyond the saved inputs, so it is as deterministic as the reference ops (run it under
samebits.deterministic_runtime(), which sets torch.use_deterministic_algorithms).

Attention is the one op that reads its keys and values from the paged cache rather than from its arguments: the
model calls `rope_write_kv` and then `attention` per layer (models/llama.py), so its `write_kv` stores detached copies
in the cache and keeps the differentiable k and v for the `attention` call on the same cache that follows.
"""
from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from samebits.kernels.ops import Ops
from samebits.rl import reference


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


class TrainOps:
    """The op set of `Ops` (kernels/ops.py OPS), differentiable; forward bits are `base`'s."""

    def __init__(self, base: Ops):
        self.base = base
        self.mode, self.device, self.deterministic = base.mode, base.device, base.deterministic
        self._pairs = {name: OpPair(getattr(base, name), getattr(reference, name))
                       for name in ("linear", "matmul", "bmm", "rms_norm", "add_rms_norm", "softmax", "log_softmax",
                                    "silu_and_mul", "det_sum_rows", "rope", "moe_experts")}
        self._attention = OpPair(self._cached_attention, self._reference_attention)
        self._pending: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
        self.philox_uniforms = base.philox_uniforms  # integer arithmetic: nothing to differentiate
        self.gumbel_race = base.gumbel_race  # a token id: nothing to differentiate
        self.moe_topk = base.moe_topk  # expert ids: nothing to differentiate (the weights are gathered after it)

    def __repr__(self) -> str:
        return f"TrainOps({self.base!r})"

    def linear(self, x, weight, bias=None):
        return _apply(self._pairs["linear"], (x, weight, bias))

    def matmul(self, a, b):
        return _apply(self._pairs["matmul"], (a, b))

    def bmm(self, a, b):
        return _apply(self._pairs["bmm"], (a, b))

    def rms_norm(self, x, weight, eps):
        return _apply(self._pairs["rms_norm"], (x, weight), (eps,))

    def add_rms_norm(self, x, residual, weight, eps):
        return _apply(self._pairs["add_rms_norm"], (x, residual, weight), (eps,))

    def softmax(self, x, dim=-1):
        return _apply(self._pairs["softmax"], (x,), (dim,))

    def log_softmax(self, x, dim=-1):
        return _apply(self._pairs["log_softmax"], (x,), (dim,))

    def silu_and_mul(self, x):
        return _apply(self._pairs["silu_and_mul"], (x,))

    def det_sum_rows(self, x):
        return _apply(self._pairs["det_sum_rows"], (x,))

    def moe_experts(self, x, w13, w2, ids, weights):
        return _apply(self._pairs["moe_experts"], (x, w13, w2, ids, weights))

    def rope(self, q, k, positions, cos_sin):
        return _apply(self._pairs["rope"], (q, k, positions, cos_sin))

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
        return _apply(self._attention, (q, k, v), (k_cache, v_cache, meta, scale))

    def _cached_attention(self, q, k, v, k_cache, v_cache, meta, scale):
        return self.base.attention(q, k_cache, v_cache, meta, scale)

    @staticmethod
    def _reference_attention(q, k, v, k_cache, v_cache, meta, scale):
        return reference.causal_attention(q, k, v, meta, scale)
