"""FP8 linears on the CPU, deterministic: the GPU's recipe with the CPU's proven GEMM.

What it computes, exactly: the activations quantised by `kernels.fp8.quantize_activations` (the bits the GPU kernels
produce); then for each K_STEP-wide slice of K, the e4m3 values of activations and weights as float32 (exact)
multiplied through the proven CPU route (`gemm.blocked_gemm`: MKL on fixed row blocks) and added to a float32 sum in K
order from zero, block scales applied to each step as (step * a_scale) * w_scale; channel scales at the end as
(sum * a_scale) * w_scale; the bias in float32; one rounding to x.dtype. Only how a step's 128 products are summed is
MKL's, so a row's bits are a function of the row, as the route proves.
"""
from __future__ import annotations

import torch

from samebits.kernels.cpu import gemm
from samebits.kernels.fp8 import FP8, K_STEP, check_linear_fp8, quantize_activations, refuse_variant


def linear_fp8(x, weight, scale, recipe, input_scale=None, bias=None):
    """x [..., K] -> [..., N] in x.dtype (Ops.linear_fp8)."""
    check_linear_fp8(x, weight, scale, recipe, input_scale, bias)
    refuse_variant(recipe, "linear_fp8 (cpu)")
    x2 = x.reshape(-1, x.shape[-1])
    q, a_scale = quantize_activations(x2, recipe, input_scale)
    n, k = weight.shape
    block = recipe.weights == "block"
    w_scale = scale.repeat_interleave(recipe.block[0], 0)[:n] if block else scale
    acc = torch.zeros(x2.shape[0], n, dtype=torch.float32)
    for i, start in enumerate(range(0, k, K_STEP)):
        cols = slice(start, start + K_STEP)
        step = gemm.blocked_gemm(q[:, cols].float(), weight[:, cols].float())[:, :n]
        if block:
            step = step * a_scale[:, i, None] * w_scale[None, :, i]
        acc = acc + step
    if not block:
        if a_scale is not None:
            acc = acc * a_scale[:, None]
        acc = acc * w_scale[None, :]
    if bias is not None:
        acc = acc + bias.float()
    return acc.to(x.dtype).reshape(*x.shape[:-1], n)


def prove_weights(weights) -> dict[str, str]:
    """Prove, at load, the GEMM shapes the FP8 weights run: their K_STEP-wide slices (and a narrower tail)."""
    for w in weights:
        if w.dim() == 2 and w.dtype == FP8 and w.device.type == "cpu":
            n, k = w.shape
            for width in {min(K_STEP, k), k % K_STEP} - {0}:
                gemm.verdict(width, max(n, gemm.MIN_N))
    return gemm.verdicts()
