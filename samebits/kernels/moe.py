"""Mixture-of-experts pieces every backend shares: the exact top-k, the routing weights, the combine, the shared-expert
gate, and the checks of the two MoE ops (docs/MOE.md).

Contract of the ops (kernels/ops.py):
- `moe_topk(scores[T, E], k) -> int64 [T, k]`: each row's k highest scores, highest first; equal scores in order of
  expert index. The deterministic backends take `topk_ids` below (a total order, so the answer is unique); fast mode
  takes torch.topk, whose ties are the vendor's.
- `moe_experts(x[T, H], w13[E, 2I, H], w2[E, H, I], ids[T, k], weights[T, k] float32) -> [T, H] in x.dtype`: for
  each (token, rank) the dense MLP of expert ids[t, j] (gate|up = x @ w13[e]^T rounded to x.dtype, silu(gate) * up
  rounded, @ w2[e]^T rounded: the bits of models/llama.py's MLP with that expert's weights), then `combine`.

The combine is by top-k rank (kernels/configs.py `moe`): acc = w0 * y0, then acc = acc + wj * yj for j = 1..k-1, in
float32 with no fused multiply-add, rounded once. Every step is one IEEE operation on the row's own values, so every
device and vector width gives the same bits for it, and a token never reads another token's outputs.
"""
from __future__ import annotations

import torch

from samebits.kernels.common import check
from samebits.kernels.vector_math import settle

_SIGN_FREE = 0x7FFFFFFF


def ordered_bits(scores: torch.Tensor) -> torch.Tensor:
    """int64 keys that order like the float32 values (IEEE bits, negatives mirrored; -0 sits just below +0)."""
    bits = scores.float().contiguous().view(torch.int32).to(torch.int64)
    return torch.where(bits < 0, bits ^ _SIGN_FREE, bits)


def topk_ids(scores: torch.Tensor, k: int) -> torch.Tensor:
    """scores [T, E] -> int64 [T, k]: the k highest, highest first, ties to the lower expert index. Each key is
    (score, E - 1 - index), unique within its row, so the top k are one set in one order whatever algorithm ranks them."""
    check(scores.dim() == 2 and 0 < k <= scores.shape[1], "moe_topk", f"scores {tuple(scores.shape)}, k={k}")
    e = scores.shape[1]
    tie = torch.arange(e - 1, -1, -1, dtype=torch.int64, device=scores.device)
    return (ordered_bits(scores) * e + tie).topk(k, dim=1).indices


def topk_weights(probs: torch.Tensor, ids: torch.Tensor, normalise: bool) -> torch.Tensor:
    """float32 [T, k]: each chosen expert's probability, renormalised to sum to one over the k (HF norm_topk_prob) by
    a sum taken left to right in rank order."""
    w = probs.float().gather(1, ids)
    if not normalise:
        return w
    total = w[:, 0]
    for j in range(1, w.shape[1]):
        total = total + w[:, j]
    return w / total[:, None]


def combine(y: torch.Tensor, weights: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """y [T, k, H] (the k expert outputs of each token, rank order), weights float32 [T, k] -> [T, H] in dtype: the
    rank-order fold of the module docstring (torch form; the Triton combine kernel gives these bits)."""
    acc = weights[:, 0, None] * y[:, 0].float()
    for j in range(1, y.shape[1]):
        acc = acc + weights[:, j, None] * y[:, j].float()
    return acc.to(dtype)


def shared_gate(logit: torch.Tensor) -> torch.Tensor:
    """Qwen2-MoE's sigmoid gate of the shared expert, [T, 1] in logit.dtype: 1 / (1 + exp(-x)) in float32, spelled
    with exp because torch's CPU sigmoid gives a vector tail other bits (kernels/cpu/backend.py)."""
    if logit.device.type == "cpu":
        settle()
    return (1.0 / (1.0 + torch.exp(-logit.float()))).to(logit.dtype)


def check_experts(x, w13, w2, ids, weights) -> None:
    check(x.dim() == 2 and w13.dim() == 3 and w2.dim() == 3, "moe_experts",
          f"x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}: need x [T, H], w13 [E, 2I, H], "
          "w2 [E, H, I]")
    e, two_i, h = w13.shape
    check(h == x.shape[1] and w2.shape == (e, h, two_i // 2) and two_i % 2 == 0, "moe_experts",
          f"x {tuple(x.shape)}, w13 {tuple(w13.shape)}, w2 {tuple(w2.shape)}: the expert shapes disagree")
    check(ids.dim() == 2 and ids.shape[0] == x.shape[0] and weights.shape == ids.shape, "moe_experts",
          f"ids {tuple(ids.shape)} and weights {tuple(weights.shape)} must be [T, k] with T = {x.shape[0]}")
    check(ids.dtype == torch.int64 and weights.dtype == torch.float32, "moe_experts",
          f"ids must be int64 and weights float32, got {ids.dtype} and {weights.dtype}")
    check(x.dtype == w13.dtype == w2.dtype, "moe_experts", f"x is {x.dtype}, w13 {w13.dtype}, w2 {w2.dtype}")


def experts_by_loop(x, w13, w2, ids, weights, linear, silu_and_mul) -> torch.Tensor:
    """The op's definition, one expert at a time through the given `linear` and `silu_and_mul` (CPU route and the
    GPU tests' reference). Which tokens an expert gets is read on the host: not for CUDA graphs."""
    t, k = ids.shape
    y = x.new_empty(t * k, x.shape[1])
    flat = ids.reshape(-1)
    for e in flat.unique().tolist():
        pairs = (flat == e).nonzero().squeeze(1)
        hidden = silu_and_mul(linear(x.index_select(0, pairs // k), w13[e]))
        y[pairs] = linear(hidden, w2[e])
    return combine(y.view(t, k, -1), weights, x.dtype)
