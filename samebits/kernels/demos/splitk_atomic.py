"""DEMONSTRATION OF THE BUG, NOT A SAMEBITS KERNEL: seed §2.2's split-K matmul (docs/BACKGROUND.md).

K is cut into SPLIT_K slices, one program per slice, and each adds its partial tile into C with `tl.atomic_add`. Float
addition is not associative and the atomics land in whatever order the hardware finishes the programs, so the same
inputs can give different bits from one run to the next. `samebits probe` runs it only to show that; nothing in the
engine may call it. Triton is imported here, not at package import, so `samebits` loads without it.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def _splitk_atomic_kernel(a_ptr, b_ptr, c_ptr, M, N, K, k_per_split,
                          BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr):
    rm = tl.program_id(0) * BM + tl.arange(0, BM)
    rn = tl.program_id(1) * BN + tl.arange(0, BN)
    k_lo = tl.program_id(2) * k_per_split
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for k0 in range(0, k_per_split, BK):
        rk = k_lo + k0 + tl.arange(0, BK)
        k_ok = (rk < K) & (rk < k_lo + k_per_split)
        a = tl.load(a_ptr + rm[:, None] * K + rk[None, :], mask=(rm[:, None] < M) & k_ok[None, :], other=0.0)
        # b is W[N, K] row-major, read as its transpose [K, N].
        b = tl.load(b_ptr + rn[None, :] * K + rk[:, None], mask=k_ok[:, None] & (rn[None, :] < N), other=0.0)
        acc += tl.dot(a, b)
    # samebits: intentionally nondeterministic because this is the bug being shown: the order of these float
    # atomic adds is the hardware's, not ours.
    tl.atomic_add(c_ptr + rm[:, None] * N + rn[None, :], acc, mask=(rm[:, None] < M) & (rn[None, :] < N))


def splitk_atomic_matmul(x, w, split_k: int = 16, bm: int = 16, bn: int = 64, bk: int = 64):
    """x[M, K] @ w[N, K].T in float32, K split across `split_k` programs that accumulate with atomics."""
    import torch

    x, w = x.contiguous(), w.contiguous()
    (m, k), n = x.shape, w.shape[0]
    out = torch.zeros(m, n, device=x.device, dtype=torch.float32)
    k_per_split = triton.cdiv(triton.cdiv(k, split_k), bk) * bk
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn), triton.cdiv(k, k_per_split))
    _splitk_atomic_kernel[grid](x, w, out, m, n, k, k_per_split, BM=bm, BN=bn, BK=bk)
    return out
