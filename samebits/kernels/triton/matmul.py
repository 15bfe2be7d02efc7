"""Triton matmul with K accumulated in sequence (no split-K, no atomics); the tile follows M, the K order never."""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels.common import interpreting
from samebits.kernels.configs import LAUNCH, TILE_CONFIGS
from samebits.kernels.triton.mma import mma

_FP = {torch.bfloat16, torch.float16, torch.float32}
# Shared memory the K pipeline may take (stages - 1 buffered A and B tiles): the H200's 227 KiB per block less room for
# the epilogue. The table's rows are sized for 2-byte inputs; float32 ones get fewer stages, which moves no bit.
_PIPELINE_BYTES = 200 * 1024


@triton.jit
def grouped_tile(pid, M, N, BM: tl.constexpr, BN: tl.constexpr, GROUP_M: tl.constexpr):
    # Grouped launch order for L2 reuse: it moves tiles between programs, never changes a tile's K order.
    num_m = tl.cdiv(M, BM)
    num_n = tl.cdiv(N, BN)
    per_group = GROUP_M * num_n
    first_m = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(num_m - first_m, GROUP_M)
    return first_m + (pid % per_group) % group_rows, (pid % per_group) // group_rows


@triton.jit
def _matmul_kernel(a_ptr, b_ptr, c_ptr, bias_ptr, M, N, K,
                   stride_am, stride_ak, stride_bk, stride_bn, stride_cm, stride_cn,
                   HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                   GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    # a [M, K], b [K, N] (any strides), c [M, N]; one program owns one [BM, BN] tile of c.
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BM, BN, GROUP_M)

    rm = pid_m * BM + tl.arange(0, BM)  # [BM]
    rn = pid_n * BN + tl.arange(0, BN)  # [BN]
    rk = tl.arange(0, BK)  # [BK]
    # Out-of-range rows/cols read a valid row (wrap) and are never stored: loads stay unmasked in M and N.
    ram = rm % M
    rbn = rn % N
    a_ptrs = a_ptr + ram[:, None] * stride_am + rk[None, :] * stride_ak  # [BM, BK]
    b_ptrs = b_ptr + rk[:, None] * stride_bk + rbn[None, :] * stride_bn  # [BK, BN]

    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BK)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            # The K tail is zero-filled: adding exact zeros keeps the sequence of partial sums.
            k_left = K - kb * BK
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = mma(a, b, acc, UPCAST, PRECISION)
        a_ptrs += BK * stride_ak
        b_ptrs += BK * stride_bk

    if HAS_BIAS:
        acc += tl.load(bias_ptr + rbn).to(tl.float32)[None, :]
    # int64: M * N passes 2^31 at prefill sizes with a 128k vocabulary.
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :] * stride_cn
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=(rm[:, None] < M) & (rn[None, :] < N))


def tile_for(m: int, table=None) -> list:
    """The [max_M, BM, BN, BK, warps, stages, GROUP_M] row of the config table that serves M rows."""
    for row in table or TILE_CONFIGS["matmul"]["config"]:
        if m <= row[0]:
            return row
    raise AssertionError("the matmul table's last row must cover every M")


def pipeline_stages(bm: int, bn: int, bk: int, stages: int, itemsize: int) -> int:
    """The row's stages, fewer where its buffered tiles of this element size would pass _PIPELINE_BYTES."""
    return min(stages, 1 + _PIPELINE_BYTES // ((bm + bn) * bk * itemsize))


def matmul_kn(a, b, bias=None, config=None, out_dtype=None):
    """a [M, K] @ b [K, N] (+ bias [N]) -> [M, N] in out_dtype (default a.dtype). a and b may be strided views (a K
    slice of activations, F.linear weights transposed)."""
    assert a.dim() == 2 and b.dim() == 2, f"matmul: a {tuple(a.shape)} and b {tuple(b.shape)} must be 2-D"
    assert a.shape[1] == b.shape[0], f"matmul: a {tuple(a.shape)} @ b {tuple(b.shape)}: inner dims differ"
    assert a.dtype == b.dtype and a.dtype in _FP, f"matmul: dtypes {a.dtype}/{b.dtype} unsupported"
    assert a.device == b.device, f"matmul: a on {a.device}, b on {b.device}"
    assert bias is None or (bias.shape == (b.shape[1],) and bias.is_contiguous()), "matmul: bias must be [N], dense"
    m, k = a.shape
    n = b.shape[1]
    c = torch.empty(m, n, device=a.device, dtype=out_dtype or a.dtype)
    if m == 0 or n == 0:
        return c
    if k == 0:
        return c.zero_() if bias is None else c.copy_(bias.expand(m, n))
    _, bm, bn, bk, warps, stages, group_m = config or tile_for(m)
    stages = pipeline_stages(bm, bn, bk, stages, a.element_size())
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _matmul_kernel[grid](
        a, b, c, bias if bias is not None else c, m, n, k,
        a.stride(0), a.stride(1), b.stride(0), b.stride(1), c.stride(0), c.stride(1),
        HAS_BIAS=bias is not None, BM=bm, BN=bn, BK=bk, GROUP_M=group_m, EVEN_K=k % bk == 0,
        UPCAST=interpreting(),  # the interpreter: fp32 products in K order (kernels/triton/mma.py)
        # fp32 inputs get IEEE fp32 products (torch's default), not TF32.
        PRECISION="ieee" if a.dtype == torch.float32 else "tf32",
        num_warps=warps, num_stages=stages, **LAUNCH,
    )
    return c


def matmul(a, b, config=None):
    return matmul_kn(a, b, None, config)


def linear(x, weight, bias=None, config=None):
    """x [..., K], weight [N, K] -> [..., N]; weight is read in place through its transposed strides."""
    assert weight.dim() == 2 and x.shape[-1] == weight.shape[1], \
        f"linear: x {tuple(x.shape)}, weight {tuple(weight.shape)}"
    x2 = x.reshape(-1, x.shape[-1])
    y = matmul_kn(x2, weight.t(), bias, config)
    return y.reshape(*x.shape[:-1], weight.shape[0])


def linear_partials(x, weights, config=None):
    """x [M, C*Kc], weights [C, N, Kc] -> float32 [C, M, N]: chunk i is x[:, i*Kc:(i+1)*Kc] @ weights[i]^T, read in
    place, accumulated and stored in float32."""
    c, n, kc = weights.shape
    out = torch.empty(c, x.shape[0], n, device=x.device, dtype=torch.float32)
    for i in range(c):
        out[i] = matmul_kn(x[:, i * kc:(i + 1) * kc], weights[i].t(), None, config, torch.float32)
    return out
