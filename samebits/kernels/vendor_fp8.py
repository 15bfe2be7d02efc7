"""torch._scaled_mm for FP8 linears: in deterministic mode only for weight shapes whose self-test in this process proved
its bits equal the Triton kernel's; in fast mode as the vendor's FP8 GEMM.

On the H200 torch runs row-wise scaled FP8 through its CUTLASS kernel: K in 128-wide tiles, each tile's four e4m3 wgmma
promoted to float32 (without fast accumulation), the activation and weight scales in the epilogue, on either side of
the product as it transposes by shape; our scales are powers of two, so that side does not change a bit
(kernels/configs.py "fp8"). Whether its tile sums equal the Triton kernel's is what the self-test proves. Taken only
with the template's pinned cuBLASLt workspace (vendor_gemm.workspace_pinned), as the bf16 route is: should torch route
row-wise FP8 through cuBLASLt instead, a workspace would let it split K.

Triple: `scaled_mm` is the launcher, `triton/fp8.gemm` the reference it must equal bit for bit, `self_test` the
proof, run once per (N, K, device) before the route is taken (`prove_weights` at load, before the KV cache is sized).
Verdicts are shown in the fingerprint (`vendor_fp8`, unhashed: a route is only taken where it gives the Triton bits).
"""
from __future__ import annotations

import torch

from samebits.kernels import fp8 as ref
from samebits.kernels.configs import TILE_CONFIGS

_CFG = TILE_CONFIGS["vendor_fp8"]["config"]
# (N, K, device index) -> passed; process-wide, as the kernel choice it proves is.
_VERDICTS: dict[tuple, bool] = {}
_ROW_WISE = ("token", "static")
assert min(_CFG["test_m"]) <= _CFG["min_m"], "vendor_fp8: the self-test must cover the smallest M the route serves"


def shape_allowed(n: int, k: int, recipe: ref.Fp8Recipe, dtype) -> bool:
    """Channel-scaled weights, per-row or static activations, a bf16 output (the row-wise kernel's only one), K a
    multiple of the 128-wide tile and N of 16 (its alignment)."""
    return (_CFG["enabled"] and recipe.weights == "channel" and recipe.activations in _ROW_WISE
            and dtype == torch.bfloat16 and k % _CFG["k_multiple"] == 0 and n % _CFG["n_multiple"] == 0)


def eligible(x2d, weight, recipe: ref.Fp8Recipe, bias) -> bool:
    """Take the vendor route for this deterministic call? Runs the shape's self-test the first time (never in a
    capture, where only shapes already proven are taken)."""
    from samebits.kernels.vendor_gemm import workspace_pinned

    m, k = x2d.shape
    n = weight.shape[0]
    if bias is not None or x2d.device.type != "cuda" or m < _CFG["min_m"] or not shape_allowed(n, k, recipe, x2d.dtype):
        return False
    if not workspace_pinned():  # should torch take cuBLASLt here, a workspace would let it split K
        return False
    if torch.cuda.is_current_stream_capturing():
        return _VERDICTS.get(_key(n, k, weight.device), False)
    return verdict(n, k, weight.device)


def _key(n: int, k: int, device) -> tuple:
    device = torch.device(device)
    return n, k, device.index if device.index is not None else torch.cuda.current_device()


def verdict(n: int, k: int, device) -> bool:
    key = _key(n, k, device)
    if key not in _VERDICTS:
        _VERDICTS[key] = self_test(n, k, device)
    return _VERDICTS[key]


def scaled_mm(q, a_scale, weight, w_scale, fast_accum: bool):
    """q [M, K] e4m3 (row scales a_scale [M]) @ weight[N, K]^T (w_scale [N]) -> bf16 [M, N]."""
    assert q.dtype == ref.FP8 and weight.dtype == ref.FP8, f"scaled_mm: {q.dtype}, {weight.dtype}"
    assert q.shape[1] == weight.shape[1], f"scaled_mm: q {tuple(q.shape)}, weight {tuple(weight.shape)}"
    return torch._scaled_mm(q, weight.t(), scale_a=a_scale.reshape(-1, 1), scale_b=w_scale.reshape(1, -1),
                            out_dtype=torch.bfloat16, use_fast_accum=fast_accum)


def _row_scales(q, a_scale):
    """Static activations carry no row scale (theirs is folded into the weight scale): ones, exact."""
    return a_scale if a_scale is not None else torch.ones(q.shape[0], dtype=torch.float32, device=q.device)


def linear(x2d, weight, scale, recipe: ref.Fp8Recipe, input_scale=None):
    """The deterministic route, for an `eligible` call: the Triton quantisation, then the proven vendor GEMM."""
    from samebits.kernels.triton.fp8 import quantize

    q, a_scale = quantize(x2d, recipe, input_scale)
    return scaled_mm(q, _row_scales(q, a_scale), weight, scale, _CFG["use_fast_accum"])


def fast_linear(x, weight, scale, recipe: ref.Fp8Recipe, input_scale=None, bias=None):
    """Fast mode's FP8 linear on CUDA (Ops.linear_fp8): the vendor's GEMM with fast accumulation where its row-wise
    kernel takes the shape, per-tensor dynamic activations included; block weights on the Triton kernel."""
    from samebits.kernels.triton import fp8 as tri

    ref.check_linear_fp8(x, weight, scale, recipe, input_scale, bias)
    x2 = x.reshape(-1, x.shape[-1])
    n, k = weight.shape
    row_wise = recipe.activations in (*_ROW_WISE, "tensor")
    if recipe.weights == "channel" and row_wise and x.dtype == torch.bfloat16 and k % 16 == 0 and n % 16 == 0:
        if recipe.activations == "tensor":
            q, a_scale = ref.quantize_activations(x2, recipe)
        else:
            q, a_scale = tri.quantize(x2, recipe, input_scale)
        y = scaled_mm(q, _row_scales(q, a_scale), weight, scale, fast_accum=True)
        y = y if bias is None else y + bias
        return y.reshape(*x.shape[:-1], n)
    if recipe.weights == "block":
        return tri.linear_fp8(x, weight, scale, recipe, input_scale, bias)
    return ref.dequantized_linear(x, weight, scale, recipe, input_scale, bias)


def self_test(n: int, k: int, device) -> bool:
    """torch._scaled_mm == the Triton kernel, every element, at each M of the table, on random data of this shape."""
    from samebits.kernels.triton import fp8 as tri

    recipe = ref.Fp8Recipe("channel", "token")
    g = torch.Generator(device=device)
    g.manual_seed(n * 131 + k)
    try:
        weight, w_scale = ref.quantize_weight(torch.randn(n, k, generator=g, device=device) * k ** -0.5)
        for m in _CFG["test_m"]:
            q, a_scale = tri.quantize(torch.randn(m, k, generator=g, device=device).to(torch.bfloat16), recipe)
            ours = tri.gemm(q, a_scale, weight, w_scale, recipe)
            if not torch.equal(scaled_mm(q, a_scale, weight, w_scale, _CFG["use_fast_accum"]), ours):
                return False
    except (torch.cuda.OutOfMemoryError, RuntimeError):
        return False  # unproven (out of memory, or torch has no row-wise FP8 kernel here): the Triton kernel serves it
    return True


def prove_weights(weights) -> dict[str, bool]:
    """Self-test every distinct FP8 weight shape up front (load time)."""
    for w in weights:
        if w.device.type == "cuda" and w.dtype == ref.FP8 and _CFG["enabled"]:
            n, k = w.shape
            if k % _CFG["k_multiple"] == 0 and n % _CFG["n_multiple"] == 0:
                verdict(n, k, w.device)
    return verdicts()


def verdicts() -> dict[str, bool]:
    """For the fingerprint: 'NxK fp8 cuda:i' -> self-test passed."""
    return {f"{n}x{k} fp8 cuda:{i}": ok for (n, k, i), ok in sorted(_VERDICTS.items())}
