"""The proven routes' self-tests for a model's shapes, run at load by every runner and tensor-parallel rank."""
from __future__ import annotations

import torch

from samebits.kernels import vendor_fp8, vendor_gemm
from samebits.kernels.cpu import attention as cpu_attention
from samebits.kernels.cpu import fp8 as cpu_fp8
from samebits.kernels.cpu import gemm as cpu_gemm


def prove_routes(ops, device: torch.device, weights: list[torch.Tensor], head_dim: int) -> None:
    """Run the proven routes' self-tests for every GEMM shape of `weights` (a model's `gemm_weights()`), now: on CUDA
    before the KV pool is sized from the free memory cuBLASLt's borrow; on the CPU so a shape MKL cannot compute
    invariantly refuses the load instead of a request. Nothing to prove when `ops` is not deterministic."""
    if not ops.deterministic:
        return
    if device.type == "cuda":
        vendor_gemm.prove_weights(weights)
        vendor_fp8.prove_weights(weights)
        torch.cuda.empty_cache()
    else:
        cpu_gemm.prove_weights(weights)
        cpu_fp8.prove_weights(weights)
        cpu_attention.prove(head_dim)
