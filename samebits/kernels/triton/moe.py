"""Fused mixture-of-experts on CUDA (the deterministic row of `moe_experts`; contract in kernels/moe.py).

The (token, rank) pairs are sorted by expert and each expert's pairs padded to whole BM-row blocks (`align`, torch
ops on the device: no host sync, so a decode step is graph-capturable). Then three launches:
- `_moe_gate_up_kernel`: one program per (block, BN columns of I): the block's rows of x against its expert's gate
  and up rows, K (the hidden size) accumulated in sequence, one tl.dot per BK step, two float32 accumulators; each
  rounded to x.dtype, then silu(gate) * up as triton/activation.py computes it, rounded: h [P, I] by pair;
- `_moe_down_kernel`: h's rows of a block against the expert's w2, K = I in sequence: y [P, H] by pair;
- `_moe_combine_kernel`: one program per (token, BLOCK columns): the k rows of y folded in rank order.
A pair's row is computed from its own row of x and its expert's weights in a fixed K order, whatever rows share its
block or how many pairs its expert got; pairs are stored to their own rows (no atomics, no scatter-add). The tile
follows the step's token count (kernels/configs.py `moe`), never the K order: on the H200 a K-sequential tl.dot gives a
row the same bits in every tile (configs.py `matmul`), so these equal the dense kernel's per expert (`reference`).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from samebits.arith import cdiv
from samebits.kernels import moe
from samebits.kernels.common import interpreting
from samebits.kernels.configs import LAUNCH, TILE_CONFIGS
from samebits.kernels.triton import activation, matmul
from samebits.kernels.triton.mma import mma

_CFG = TILE_CONFIGS["moe"]["config"]
_DTYPES = (torch.bfloat16, torch.float16, torch.float32)


@triton.jit
def _block_rows(pairs_ptr, block_expert_ptr, block, BM: tl.constexpr):
    # -> (expert, the block's pair ids [BM], which are real): a padding slot holds the sentinel P.
    expert = tl.load(block_expert_ptr + block)
    rows = tl.load(pairs_ptr + block * BM + tl.arange(0, BM))
    return expert, rows


@triton.jit
def _moe_gate_up_kernel(x_ptr, w_ptr, h_ptr, pairs_ptr, block_expert_ptr, P, K, INTER,
                        stride_xm, stride_we, stride_wn, stride_hm,
                        TOPK: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                        EVEN_K: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                        LIBDEVICE: tl.constexpr):
    # x [T, K], w [E, 2*INTER, K] (gate rows, then up rows), h [P, INTER]; grid (blocks * cdiv(INTER, BN),).
    num_n = tl.cdiv(INTER, BN)
    block, pid_n = tl.program_id(0) // num_n, tl.program_id(0) % num_n
    expert, rows = _block_rows(pairs_ptr, block_expert_ptr, block, BM)
    if expert < 0:  # past the last expert's blocks: nothing to compute
        return
    real = rows < P
    token = tl.where(real, rows // TOPK, 0).to(tl.int64)  # padding rows read token 0 and are never stored
    rn = pid_n * BN + tl.arange(0, BN)
    rwn = rn % INTER  # columns past INTER wrap onto real ones and are never stored: loads stay unmasked in N
    rk = tl.arange(0, BK)
    a_ptrs = x_ptr + token[:, None] * stride_xm + rk[None, :]
    w_base = w_ptr + expert.to(tl.int64) * stride_we
    g_ptrs = w_base + rwn[None, :] * stride_wn + rk[:, None]  # [BK, BN]: the gate rows, transposed
    u_ptrs = g_ptrs + INTER * stride_wn  # the up rows
    acc_g = tl.zeros((BM, BN), dtype=tl.float32)
    acc_u = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BK)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            g = tl.load(g_ptrs)
            u = tl.load(u_ptrs)
        else:  # the K tail zero-filled: exact zeros keep the sequence of partial sums
            k_left = K - kb * BK
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            g = tl.load(g_ptrs, mask=rk[:, None] < k_left, other=0.0)
            u = tl.load(u_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc_g = mma(a, g, acc_g, UPCAST, PRECISION)
        acc_u = mma(a, u, acc_u, UPCAST, PRECISION)
        a_ptrs += BK
        g_ptrs += BK
        u_ptrs += BK
    # The unfused form's roundings: gate and up stored in the model dtype, then triton/activation.py's arithmetic.
    gate = acc_g.to(h_ptr.dtype.element_ty).to(tl.float32)
    up = acc_u.to(h_ptr.dtype.element_ty).to(tl.float32)
    if LIBDEVICE:
        e = libdevice.exp(-gate)
    else:  # the interpreter has no libdevice; its tl.exp is numpy's accurate exp
        e = tl.exp(-gate)
    out = tl.math.div_rn(gate, 1.0 + e) * up
    h_ptrs = h_ptr + rows.to(tl.int64)[:, None] * stride_hm + rn[None, :]
    tl.store(h_ptrs, out.to(h_ptr.dtype.element_ty), mask=real[:, None] & (rn[None, :] < INTER))


@triton.jit
def _moe_down_kernel(h_ptr, w_ptr, y_ptr, pairs_ptr, block_expert_ptr, P, K, N,
                     stride_hm, stride_we, stride_wn, stride_ym,
                     BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr, EVEN_K: tl.constexpr,
                     UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    # h [P, K], w [E, N, K], y [P, N]; grid (blocks * cdiv(N, BN),).
    num_n = tl.cdiv(N, BN)
    block, pid_n = tl.program_id(0) // num_n, tl.program_id(0) % num_n
    expert, rows = _block_rows(pairs_ptr, block_expert_ptr, block, BM)
    if expert < 0:
        return
    real = rows < P
    row = tl.where(real, rows, 0).to(tl.int64)
    rn = pid_n * BN + tl.arange(0, BN)
    rwn = rn % N
    rk = tl.arange(0, BK)
    a_ptrs = h_ptr + row[:, None] * stride_hm + rk[None, :]
    b_ptrs = w_ptr + expert.to(tl.int64) * stride_we + rwn[None, :] * stride_wn + rk[:, None]
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BK)):
        if EVEN_K:
            a = tl.load(a_ptrs)
            b = tl.load(b_ptrs)
        else:
            k_left = K - kb * BK
            a = tl.load(a_ptrs, mask=rk[None, :] < k_left, other=0.0)
            b = tl.load(b_ptrs, mask=rk[:, None] < k_left, other=0.0)
        acc = mma(a, b, acc, UPCAST, PRECISION)
        a_ptrs += BK
        b_ptrs += BK
    y_ptrs = y_ptr + rows.to(tl.int64)[:, None] * stride_ym + rn[None, :]
    tl.store(y_ptrs, acc.to(y_ptr.dtype.element_ty), mask=real[:, None] & (rn[None, :] < N))


@triton.jit
def _moe_combine_kernel(y_ptr, w_ptr, out_ptr, N, stride_ym, stride_om, TOPK: tl.constexpr, BLOCK: tl.constexpr):
    # y [T * TOPK, N] (token t's rank j at row t * TOPK + j), w [T, TOPK] float32, out [T, N]; grid (T, cdiv(N, BLOCK)).
    # acc = w0 * y0, then acc = acc + wj * yj in rank order (kernels/moe.py `combine`; fp fusion is off at launch).
    t = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    mask = cols < N
    acc = tl.load(w_ptr + t * TOPK) * tl.load(y_ptr + t * TOPK * stride_ym + cols, mask=mask, other=0.0).to(tl.float32)
    for j in tl.static_range(1, TOPK):
        y = tl.load(y_ptr + (t * TOPK + j) * stride_ym + cols, mask=mask, other=0.0).to(tl.float32)
        acc = acc + tl.load(w_ptr + t * TOPK + j) * y
    tl.store(out_ptr + t * stride_om + cols, acc.to(out_ptr.dtype.element_ty), mask=mask)


def tile_for(tokens: int, table=None) -> list:
    """The [max_T, BM, BN, BK, warps, stages] row of the moe table that serves a step of `tokens` tokens."""
    for row in table or _CFG["tiles"]:
        if tokens <= row[0]:
            return row
    raise AssertionError("the moe table's last row must cover every token count")


def align(ids: torch.Tensor, num_experts: int, bm: int) -> tuple[torch.Tensor, torch.Tensor]:
    """ids [T, k] -> (pairs int32 [blocks * bm], block_expert int32 [blocks]): pair p = t * k + j sorted by expert,
    each expert's pairs padded with the sentinel P to whole blocks; a block past the last expert's gets expert -1.
    Torch ops on the device, no host sync; `blocks` (P + min(E, P) * (bm - 1) rows at most) follows from the shape."""
    p = ids.numel()
    dev = ids.device
    flat = ids.reshape(-1)
    index = torch.arange(p, dtype=torch.int64, device=dev)
    order = (flat * p + index).sort().indices  # unique keys: one order, by expert then pair
    expert_of = flat.index_select(0, order)
    experts = torch.arange(num_experts, dtype=torch.int64, device=dev)
    first = torch.searchsorted(expert_of, experts)
    count = torch.searchsorted(expert_of, experts, right=True) - first
    padded = (count + bm - 1) // bm * bm
    ends = padded.cumsum(0)
    dest = (ends - padded).index_select(0, expert_of) + index - first.index_select(0, expert_of)
    blocks = cdiv(p + min(num_experts, p) * (bm - 1), bm)
    pairs = torch.full((blocks * bm,), p, dtype=torch.int64, device=dev).scatter_(0, dest, order)
    starts = torch.arange(blocks, dtype=torch.int64, device=dev) * bm
    block_expert = torch.where(starts < ends[-1], torch.searchsorted(ends, starts, right=True), -1)
    return pairs.to(torch.int32), block_expert.to(torch.int32)


def _stages(bm: int, bn: int, bk: int, stages: int, itemsize: int, b_tiles: int) -> int:
    """The row's stages, fewer where the buffered A and (b_tiles) B tiles would pass the matmul's shared-memory cap."""
    return min(stages, 1 + matmul._PIPELINE_BYTES // ((bm + b_tiles * bn) * bk * itemsize))


def _check(x, w13, w2, ids, weights) -> None:
    moe.check_experts(x, w13, w2, ids, weights)
    assert x.dtype in _DTYPES, f"moe_experts: dtype {x.dtype} unsupported"
    assert x.stride(1) == 1 and w13.stride(2) == 1 and w2.stride(2) == 1, "moe_experts: K must be contiguous"
    assert ids.device == x.device == w13.device == w2.device == weights.device, "moe_experts: devices differ"


def fused_experts(x, w13, w2, ids, weights, config=None) -> torch.Tensor:
    """x [T, H], w13 [E, 2I, H], w2 [E, H, I], ids int64 [T, k], weights float32 [T, k] -> [T, H] in x.dtype."""
    _check(x, w13, w2, ids, weights)
    t, k = ids.shape
    e, two_i, hidden = w13.shape
    inter = two_i // 2
    out = torch.empty_like(x)
    if t == 0:
        return out
    _, bm, bn, bk, warps, stages = config or tile_for(t)
    pairs, block_expert = align(ids, e, bm)
    blocks = block_expert.shape[0]
    p = t * k
    common = dict(UPCAST=interpreting(), PRECISION="ieee" if x.dtype == torch.float32 else "tf32",
                  num_warps=warps, **LAUNCH)
    h = x.new_empty(p, inter)
    _moe_gate_up_kernel[(blocks * triton.cdiv(inter, bn),)](
        x, w13, h, pairs, block_expert, p, hidden, inter, x.stride(0), w13.stride(0), w13.stride(1), h.stride(0),
        TOPK=k, BM=bm, BN=bn, BK=bk, EVEN_K=hidden % bk == 0, LIBDEVICE=not interpreting(),
        num_stages=_stages(bm, bn, bk, stages, x.element_size(), 2), **common)
    y = x.new_empty(p, hidden)
    _moe_down_kernel[(blocks * triton.cdiv(hidden, bn),)](
        h, w2, y, pairs, block_expert, p, inter, hidden, h.stride(0), w2.stride(0), w2.stride(1), y.stride(0),
        BM=bm, BN=bn, BK=bk, EVEN_K=inter % bk == 0, num_stages=_stages(bm, bn, bk, stages, x.element_size(), 1),
        **common)
    block = _CFG["combine_block"]
    _moe_combine_kernel[(t, triton.cdiv(hidden, block))](y, weights.contiguous(), out, hidden, y.stride(0),
                                                          out.stride(0), TOPK=k, BLOCK=block,
                                                          num_warps=_CFG["combine_warps"], **LAUNCH)
    return out


def reference(x, w13, w2, ids, weights, config=None) -> torch.Tensor:
    """The same op one expert at a time through the dense Triton matmul and activation kernels, combined by the torch
    form (kernels/moe.py): what the fused kernels must equal bit for bit."""
    return moe.experts_by_loop(x, w13, w2, ids, weights, lambda a, w: matmul.linear(a, w, config=config),
                               activation.silu_and_mul)
