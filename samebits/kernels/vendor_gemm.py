"""cuBLASLt without workspace for linears, taken only for weight shapes where a self-test proved its bits equal the Triton
kernel's (both accumulate K in sequence with tensor-core MMA: docs/BACKGROUND.md, baseline canonical): inside CUDA graphs at every
M, eagerly only for GEMMs big enough to pay torch's per-call host cost.

Triple: `lt_linear` is the launcher, the Triton `triton/matmul.linear` is the reference it must equal bit for bit, and
`self_test` is the proof, run once per (N, K, dtype, device) before the route is taken. Verdicts are shown in the
fingerprint (`vendor_gemm`); a failed or skipped test only means the Triton kernel runs, with the same bits.
"""
from __future__ import annotations

import contextlib
import os

import torch
import torch.nn.functional as F

from samebits.kernels.configs import TILE_CONFIGS

_CFG = TILE_CONFIGS["vendor_gemm"]["config"]
_LT_DTYPES = (torch.bfloat16, torch.float16)
# (N, K, dtype, device index) -> passed; process-wide because the cuBLASLt choice it proves is process-wide too.
_VERDICTS: dict[tuple, bool] = {}


def workspace_pinned() -> bool:
    """torch reads CUBLASLT_WORKSPACE_SIZE once, at its first cuBLASLt call; the template exports it at start."""
    return os.environ.get("CUBLASLT_WORKSPACE_SIZE") == _CFG["workspace_kib"]


def shape_allowed(n: int, k: int, dtype) -> bool:
    """The measured domain: K a multiple of 64 (a K tail changes the bits), N > 1 (N = 1 is a GEMV path)."""
    return _CFG["enabled"] and k % _CFG["k_multiple"] == 0 and n >= _CFG["min_n"] and dtype in _LT_DTYPES


def pays_eagerly(m: int, n: int, k: int) -> bool:
    """torch spends host time on every eager cuBLASLt call (its heuristic query): worth it only for GEMMs whose GPU
    time is longer than that (docs/BENCHMARKS.md §2). Inside a CUDA graph the host cost is gone and cuBLASLt is
    faster at every M."""
    return 2 * m * n * k > _CFG["eager_min_gflop"] * 1e9


def eligible(x2d, weight, bias) -> bool:
    """Take cuBLASLt for this call? Runs the weight shape's self-test the first time it is asked (never in a capture)."""
    m, k = x2d.shape
    n = weight.shape[0]
    if bias is not None or x2d.device.type != "cuda" or not shape_allowed(n, k, x2d.dtype):
        return False
    if not workspace_pinned():
        return False
    if torch.cuda.is_current_stream_capturing():
        return is_proven(weight)
    return pays_eagerly(m, n, k) and verdict(n, k, x2d.dtype, x2d.device)


def is_proven(weight) -> bool:
    """Has this weight's shape already passed its self-test in this process? (Never runs one.)"""
    return _VERDICTS.get(_key(*weight.shape, weight.dtype, weight.device), False)


def _key(n: int, k: int, dtype, device) -> tuple:
    device = torch.device(device)
    return n, k, str(dtype)[6:], device.index if device.index is not None else torch.cuda.current_device()


def verdict(n: int, k: int, dtype, device) -> bool:
    key = _key(n, k, dtype, device)
    if key not in _VERDICTS:
        _VERDICTS[key] = self_test(n, k, dtype, device)
    return _VERDICTS[key]


@contextlib.contextmanager
def cublaslt():
    """torch's BLAS preference is process-global: set it for one call, restore what was there (nesting-safe)."""
    prev = torch.backends.cuda.preferred_blas_library()
    torch.backends.cuda.preferred_blas_library("cublaslt")
    try:
        yield
    finally:
        torch.backends.cuda.preferred_blas_library(prev)


def lt_linear(x2d, weight):
    """x2d [M, K] @ weight[N, K].T -> [M, N] through cuBLASLt with the template's pinned workspace."""
    assert x2d.dim() == 2 and weight.dim() == 2, f"lt_linear: x {tuple(x2d.shape)}, weight {tuple(weight.shape)}"
    assert x2d.shape[1] == weight.shape[1], f"lt_linear: K differs: x {tuple(x2d.shape)}, w {tuple(weight.shape)}"
    assert x2d.dtype == weight.dtype and x2d.dtype in _LT_DTYPES, f"lt_linear: dtype {x2d.dtype} unsupported"
    with cublaslt():
        return F.linear(x2d, weight)


def self_test(n: int, k: int, dtype, device) -> bool:
    """cuBLASLt == the Triton kernel, every element, at each M of the table, on random data of this shape."""
    from samebits.kernels.triton.matmul import linear as triton_linear

    g = torch.Generator(device=device)
    g.manual_seed(n * 131 + k)
    try:
        w = (torch.randn(n, k, generator=g, device=device) * k ** -0.5).to(dtype)
        for m in _CFG["test_m"]:
            x = torch.randn(m, k, generator=g, device=device).to(dtype)
            if not torch.equal(lt_linear(x, w), triton_linear(x, w)):
                return False
    except torch.cuda.OutOfMemoryError:
        return False  # unproven, so the Triton kernel serves this shape: the same bits, no failed load
    return True


def prove_weights(weights) -> dict[str, bool]:
    """Self-test every distinct linear weight shape up front (before the KV cache takes the memory)."""
    for w in weights:
        if w.device.type == "cuda" and workspace_pinned() and shape_allowed(*w.shape, w.dtype):
            verdict(w.shape[0], w.shape[1], w.dtype, w.device)
    return verdicts()


def verdicts() -> dict[str, bool]:
    """For the fingerprint: 'NxK dtype cuda:i' -> self-test passed."""
    return {f"{n}x{k} {dt} cuda:{i}": ok for (n, k, dt, i), ok in sorted(_VERDICTS.items())}
