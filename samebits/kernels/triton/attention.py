"""Triton paged attention and its split merge (the why of the tiles: samebits/kernels/attention.py).

Two tile layouts, one set of bits. Decode tiles put the query rows on the MMA's N side (S^T = K Q^T, O^T = V^T P^T),
so 4 GQA rows use 4 of a 16-row tile, not 4 of 64; prefill tiles put them on M, FlashAttention's layout (S = Q K^T,
O = P V with P the MMA's A operand in registers), where the softmax max stays inside a warp and P never goes through
shared memory. On the H200 every element of S, of acc + P V and of a ones-MMA row sum has the same bits whichever side
its row is on, at 16-128 rows, 4 and 8 warps (docs/results/mma_roles.h200.json); the max is exact and exp2
elementwise. The row sum l is the one reduction whose order would follow the layout (tl.sum), so both layouts take it
through the MMA: P times a ones block, accumulated like the output.

Imported lazily (only on CUDA or under TRITON_INTERPRET=1) so that importing samebits never needs triton. The launcher
checks shapes, dtypes and strides; the torch reference is kernels.attention.paged_attention_reference (float64).
No float atomics: each output element is written by exactly one program; the one atomic is an integer counter that
picks which of a tile's split programs merges the splits (_merge_if_last), never what it computes.
"""
from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from triton.tools.tensor_descriptor import TensorDescriptor

from samebits.arith import cdiv
from samebits.kernels.common import interpreting, next_pow2
from samebits.kernels.configs import TILE_CONFIGS
from samebits.kernels.triton.mma import mma

_QT = TILE_CONFIGS["attention.query_tile"]["config"]
ROWS = _QT["rows"]
DECODE_ROWS = _QT["decode_rows"]
ROWS_ON_M = _QT["rows_on_m_from"]
NUM_WARPS = _QT["num_warps"]
PREFILL_WARPS = _QT["prefill_warps"]
NUM_STAGES = _QT["num_stages"]
# Pinned: Triton's default for contracting a*b+c into fma changes across versions (3.10 flips it), and it changes bits.
FP_FUSION = _QT["fp_fusion"]
BLOCK_N = TILE_CONFIGS["attention.kv_tile"]["config"]["tokens"]
SPLIT = TILE_CONFIGS["attention.split_kv"]["config"]["tokens"]
assert SPLIT % BLOCK_N == 0, "a split must hold whole KV tiles"
HEAD_DIMS = (64, 128)  # the head dims with a fixed tile
# The ones block's other side: wgmma's M (64) where it is the A operand (rows on N); the smallest N that keeps a
# prefill tile's row-sum accumulator small where it is the B operand (rows on M). Neither changes a bit.
ONES_M = tl.constexpr(64)
ONES_N = tl.constexpr(16)
LOG2E = 1.4426950408889634  # softmax runs in base 2: exp(x * scale) == exp2(x * scale * log2(e))


@triton.jit
def _tile_blocks(bt_row, n0, last, BLOCK_N: tl.constexpr, BS: tl.constexpr):
    # The block id of each of the tile's keys (0 past `last`, where the loads are masked anyway). Pages of a multiple
    # of BLOCK_N tokens hold whole tiles: one id.
    if BS % BLOCK_N == 0:
        ids = tl.load(bt_row + n0 // BS, mask=n0 <= last, other=0)
    else:
        n = n0 + tl.arange(0, BLOCK_N)
        ids = tl.load(bt_row + n // BS, mask=n <= last, other=0)
    return ids


@triton.jit
def _tile_loads(K, V, KD, VD, blk32, n0, last, h, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                BLOCK_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, MASKED: tl.constexpr,
                ON_M: tl.constexpr, TMA: tl.constexpr):
    # K [BN, D] and V ([BN, D] for rows on M, V^T [D, BN] for rows on N) of keys n0..n0+BLOCK_N-1; every key of a
    # tile is either read or beyond every row's reach. TMA (pages of whole tiles): the tile through the caches'
    # descriptors KD/VD ([NB * BS, Hkv * D]), one copy each and no address arithmetic per key. A copy's box cannot
    # mask keys, so a masked tile's keys past `last` hold whatever their slots hold (a reused page's old keys, NaN at
    # worst): V's are zeroed (0 * NaN would reach the output), K's only reach scores that the causal mask replaces.
    # Else gathered (_tile_gather). The same values either way.
    if TMA:
        r0 = blk32 * BS + n0 % BS
        k = KD.load([r0, h * D])
        v = VD.load([r0, h * D])
        if MASKED:
            v = tl.where((n0 + tl.arange(0, BLOCK_N) <= last)[:, None], v, 0.0)
        if not ON_M:
            v = tl.trans(v)
    else:
        k, v = _tile_gather(K, V, blk32, n0, last, h, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                            stride_vh, BLOCK_N, D, BS, ON_M)
    return k, v


@triton.jit
def _tile_gather(K, V, blk32, n0, last, h, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                 BLOCK_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, ON_M: tl.constexpr):
    # Through the block ids blk32 (_tile_blocks); keys past `last` read as 0 (no memory traffic), and every key of a
    # tile is either read or beyond every row's reach. Always masked: the block ids a tile ahead may pass `last`.
    n = n0 + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    blk = blk32.to(tl.int64)
    if BS % BLOCK_N == 0:  # one page: a scalar base and the tile's 32-bit offsets, far fewer integer instructions
        K = K + (blk * stride_kb + (n0 % BS) * stride_ks + h * stride_kh)
        V = V + (blk * stride_vb + (n0 % BS) * stride_vs + h * stride_vh)
        row = tl.arange(0, BLOCK_N) * stride_ks
        row_v = tl.arange(0, BLOCK_N) * stride_vs
    else:
        row = blk * stride_kb + (n % BS) * stride_ks + h * stride_kh
        row_v = blk * stride_vb + (n % BS) * stride_vs + h * stride_vh
    kv_ok = n <= last
    k = tl.load(K + row[:, None] + d[None, :], mask=kv_ok[:, None], other=0.0)
    if ON_M:
        v = tl.load(V + row_v[:, None] + d[None, :], mask=kv_ok[:, None], other=0.0)
    else:
        v = tl.load(V + row_v[None, :] + d[:, None], mask=kv_ok[None, :], other=0.0)
    return k, v


@triton.jit
def _tile_math(q, m, l2, acc, k, v, ones, n0, pos, qk_scale, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
               PRECISION: tl.constexpr, MASKED: tl.constexpr, ON_M: tl.constexpr):
    # Rows on M: q [BQ, D], l2 [BQ, ONES_N], acc [BQ, D], v [BN, D], ones [BN, ONES_N]. Rows on N: q [D, BQ],
    # l2 [ONES_M, BQ], acc [D, BQ], v [D, BN], ones [ONES_M, BN]. m [BQ] fp32 (log2 domain); every row (N) or
    # column (M) of l2 is the rows' sums of P. MASKED=False is only used for tiles whose every key every live row
    # sees: there the causal mask and the live-row selects are identities, so both variants give a row the same bits
    # (the diagonal tiles use MASKED).
    n = n0 + tl.arange(0, BLOCK_N)
    if UPCAST:
        k = k.to(tl.float32)
        v = v.to(tl.float32)
    if ON_M:
        s = mma(q, tl.trans(k), None, UPCAST, PRECISION) * qk_scale  # [BQ, BN]
        if MASKED:
            s = tl.where(n[None, :] <= pos[:, None], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 1))
    else:
        s = mma(k, q, None, UPCAST, PRECISION) * qk_scale  # S^T [BN, BQ]
        if MASKED:
            s = tl.where(n[:, None] <= pos[None, :], s, float("-inf"))
        m_new = tl.maximum(m, tl.max(s, 0))
    if MASKED:
        live = pos >= n0  # the tile holds at least one of the row's keys; other rows keep their state bit for bit
        m_safe = tl.where(live, m_new, 0.0)
    else:
        m_safe = m_new
    alpha = tl.exp2(m - m_safe)
    if ON_M:
        p = tl.exp2(s - m_safe[:, None]).to(v.dtype)
        l2_new = mma(p, ones, l2 * alpha[:, None], UPCAST, PRECISION)
        acc_new = mma(p, v, acc * alpha[:, None], UPCAST, PRECISION)
        if MASKED:
            l2_new = tl.where(live[:, None], l2_new, l2)
            acc_new = tl.where(live[:, None], acc_new, acc)
    else:
        p = tl.exp2(s - m_safe[None, :]).to(v.dtype)
        l2_new = mma(ones, p, l2 * alpha[None, :], UPCAST, PRECISION)
        acc_new = mma(v, p, acc * alpha[None, :], UPCAST, PRECISION)
        if MASKED:
            l2_new = tl.where(live[None, :], l2_new, l2)
            acc_new = tl.where(live[None, :], acc_new, acc)
    if MASKED:
        m_new = tl.where(live, m_new, m)
    return m_new, l2_new, acc_new


@triton.jit
def _row_sums(l2, ON_M: tl.constexpr):
    # The rows' l from the ones-MMA accumulator: its first column (M) or row (N), picked by adding zeros (exact).
    if ON_M:
        l = tl.sum(tl.where(tl.arange(0, l2.shape[1])[None, :] == 0, l2, 0.0), 1)
    else:
        l = tl.sum(tl.where(tl.arange(0, l2.shape[0])[:, None] == 0, l2, 0.0), 0)
    return l


@triton.jit
def _fold(m_r, l_r, acc_r, m_s, l_s, acc_s, live, ON_M: tl.constexpr):
    # The one merge formula, shared by the sequential fold and the merge kernel so both round identically.
    # m/l [BQ], acc [BQ, D] (ON_M) or [D, BQ]; rows where live is False keep the running state bit for bit.
    m = tl.maximum(m_r, m_s)
    m_safe = tl.where(live, m, 0.0)
    a = tl.exp2(m_r - m_safe)
    b = tl.exp2(m_s - m_safe)
    l = tl.fma(l_r, a, l_s * b)
    if ON_M:
        acc = tl.where(live[:, None], tl.fma(acc_r, a[:, None], acc_s * b[:, None]), acc_r)
    else:
        acc = tl.where(live[None, :], tl.fma(acc_r, a[None, :], acc_s * b[None, :]), acc_r)
    return tl.where(live, m, m_r), tl.where(live, l, l_r), acc


@triton.jit
def _fold_tiles(q, m, l2, acc, ones, blk, K, V, KD, VD, bt_row, lo, hi, last, pos, h, qk_scale,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                BLOCK_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                MASKED: tl.constexpr, ON_M: tl.constexpr, TMA: tl.constexpr):
    # Keys lo..hi-1 folded tile by tile in order. blk holds tile lo's block ids and each iteration loads the next
    # tile's (masked: it may pass `last`), returned for the next range. So a tile's copies never wait on the block
    # table, and Triton's pipeliner issues them NUM_STAGES - 1 tiles early; when each tile loaded its own ids, its
    # copies were issued at the end of the iteration before, at every stage count (SASS, docs/results/HISTORY.md §3).
    for n0 in range(lo, hi, BLOCK_N):
        nxt = _tile_blocks(bt_row, n0 + BLOCK_N, last, BLOCK_N, BS)
        k, v = _tile_loads(K, V, KD, VD, blk, n0, last, h, stride_kb, stride_ks, stride_kh,
                           stride_vb, stride_vs, stride_vh, BLOCK_N, D, BS, MASKED, ON_M, TMA)
        m, l2, acc = _tile_math(q, m, l2, acc, k, v, ones, n0, pos, qk_scale, BLOCK_N, UPCAST, PRECISION, MASKED,
                                ON_M)
        blk = nxt
    return m, l2, acc, blk


@triton.jit
def _rows(cu_seqlens_q, context_lens, b, pid_m, G: tl.constexpr, BQ: tl.constexpr):
    # Tile rows are (token, head-in-group) pairs: row r is token tok0 + r // G, query head h * G + r % G.
    TM: tl.constexpr = BQ // G
    q_start = tl.load(cu_seqlens_q + b)
    n_new = tl.load(cu_seqlens_q + b + 1) - q_start
    ctx = tl.load(context_lens + b)
    tok0 = pid_m * TM
    r = tl.arange(0, BQ)
    tq = tok0 + r // G
    row_ok = (r < TM * G) & (tq < n_new)  # a G that does not divide BQ leaves the last rows unused
    first = ctx - n_new
    pos = tl.where(row_ok, first + tq, -1)
    last = tl.minimum(first + tok0 + TM - 1, ctx - 1)
    t_idx = (q_start + tq).to(tl.int64)
    return tok0 < n_new, t_idx, r % G, row_ok, pos, last, first + tok0


@triton.jit
def _rows_ptrs(base, t_idx, qh, stride_t, stride_h, D: tl.constexpr, ON_M: tl.constexpr):
    # Pointers to the tile's rows ([BQ, D] on M, [D, BQ] on N) of a [T, H, D] tensor with a contiguous head dim
    # (the split partials: p_idx, 0, D, 0).
    d = tl.arange(0, D)
    row = t_idx * stride_t + qh * stride_h
    if ON_M:
        ptrs = base + row[:, None] + d[None, :]
    else:
        ptrs = base + row[None, :] + d[:, None]
    return ptrs


@triton.jit
def _rows_mask(ok, ON_M: tl.constexpr):
    if ON_M:
        mask = ok[:, None]
    else:
        mask = ok[None, :]
    return mask


@triton.jit
def _store_rows(O, t_idx, qh, stride_ot, stride_oh, acc, l, row_ok, D: tl.constexpr, ON_M: tl.constexpr):
    # The rows' output acc / l (rows with no key: 0), in O's dtype.
    l_safe = tl.where(l > 0, l, 1.0)
    if ON_M:
        out = acc / l_safe[:, None]
    else:
        out = acc / l_safe[None, :]
    tl.store(_rows_ptrs(O, t_idx, qh, stride_ot, stride_oh, D, ON_M), out.to(O.dtype.element_ty),
             mask=_rows_mask(row_ok, ON_M))


@triton.jit
def _paged_attention_kernel(
        Q, K, V, KD, VD, O, PM, PL, PACC, RUN, SEM, cu_seqlens_q, context_lens, block_tables, qk_scale, n_split_grid,
        num_q_heads, stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        G: tl.constexpr, BQ: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
        SPLIT: tl.constexpr, PARTIAL: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
        ON_M: tl.constexpr, RUN_IN_MEMORY: tl.constexpr, TMA: tl.constexpr, FUSED_MERGE: tl.constexpr):
    # grid (query tiles, B, Hkv * n_split_grid). PARTIAL: split `sid` only, (m, l, acc) to PM/PL [T, Hq, S] and
    # PACC [T, Hq, S, D]; otherwise every split folded in order into O [T, Hq, D]. Block ids a tile ahead
    # (_fold_tiles). ON_M: the query rows on the MMA's M side (prefill tiles), else on N (decode tiles); the same
    # bits. TMA: the tiles copied through the descriptors KD/VD (_tile_loads). FUSED_MERGE (PARTIAL, rows on N): the
    # last of a tile's split programs merges them (_merge_if_last, counters SEM), so no merge kernel is launched.
    # RUN_IN_MEMORY: the folded accumulator waits for the next split in RUN [T, Hq, D] fp32 rather than in registers
    # through its tile loop (a [64, 128] prefill tile would spill); a load and a store of exact fp32, the same bits.
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2) // n_split_grid
    sid = tl.program_id(2) % n_split_grid
    has_rows, t_idx, g, row_ok, pos, last, first_pos = _rows(cu_seqlens_q, context_lens, b, pid_m, G, BQ)
    if has_rows:
        qh = h * G + g
        q = tl.load(_rows_ptrs(Q, t_idx, qh, stride_qt, stride_qh, D, ON_M), mask=_rows_mask(row_ok, ON_M),
                    other=0.0)
        dt = Q.dtype.element_ty
        if UPCAST:
            q = q.to(tl.float32)
            dt = tl.float32
        if ON_M:
            ones = tl.full([BLOCK_N, ONES_N], 1.0, dt)
            acc0 = tl.zeros([BQ, D], tl.float32)
            l20 = tl.zeros([BQ, ONES_N], tl.float32)
        else:
            ones = tl.full([ONES_M, BLOCK_N], 1.0, dt)
            acc0 = tl.zeros([D, BQ], tl.float32)
            l20 = tl.zeros([ONES_M, BQ], tl.float32)
        n_splits = last // SPLIT + 1
        lo_split = 0
        hi_split = n_splits
        if PARTIAL:
            lo_split = sid
            hi_split = tl.minimum(sid + 1, n_splits)
        bt_row = block_tables + b * stride_bt
        m_run = tl.full([BQ], float("-inf"), tl.float32)
        l_run = tl.zeros([BQ], tl.float32)
        if not RUN_IN_MEMORY:
            acc_run = acc0
        for s_idx in range(lo_split, hi_split):
            m = tl.full([BQ], float("-inf"), tl.float32)
            kv_lo = s_idx * SPLIT
            kv_hi = tl.minimum(kv_lo + SPLIT, last + 1)
            full_hi = tl.minimum(kv_lo + tl.maximum(first_pos + 1 - kv_lo, 0) // BLOCK_N * BLOCK_N, kv_hi)
            blk = _tile_blocks(bt_row, kv_lo, last, BLOCK_N, BS)
            m, l2, acc, blk = _fold_tiles(q, m, l20, acc0, ones, blk, K, V, KD, VD, bt_row, kv_lo, full_hi, last,
                                          pos, h, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                                          stride_vh, BLOCK_N, D, BS, UPCAST, PRECISION, False, ON_M, TMA)
            m, l2, acc, blk = _fold_tiles(q, m, l2, acc, ones, blk, K, V, KD, VD, bt_row, full_hi, kv_hi, last,
                                          pos, h, qk_scale, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs,
                                          stride_vh, BLOCK_N, D, BS, UPCAST, PRECISION, True, ON_M, TMA)
            l = _row_sums(l2, ON_M)
            if PARTIAL:
                ok = row_ok & (pos >= kv_lo)
                p_idx = (t_idx * num_q_heads + qh) * n_split_grid + s_idx  # [BQ]
                tl.store(PM + p_idx, m, mask=ok)
                tl.store(PL + p_idx, l, mask=ok)
                tl.store(_rows_ptrs(PACC, p_idx, 0, D, 0, D, ON_M), acc, mask=_rows_mask(ok, ON_M))
            else:
                if RUN_IN_MEMORY:
                    run = _rows_ptrs(RUN, t_idx, qh, num_q_heads * D, D, D, ON_M)
                    not_first = tl.full([BQ], s_idx, tl.int32) > lo_split  # the first split folds into zeros
                    before = tl.load(run, mask=_rows_mask(row_ok & not_first, ON_M), other=0.0)
                    m_run, l_run, folded = _fold(m_run, l_run, before, m, l, acc, pos >= kv_lo, ON_M)
                    if s_idx + 1 < hi_split:
                        tl.store(run, folded, mask=_rows_mask(row_ok, ON_M))
                else:
                    m_run, l_run, acc_run = _fold(m_run, l_run, acc_run, m, l, acc, pos >= kv_lo, ON_M)
                    folded = acc_run
                if s_idx + 1 == hi_split:
                    _store_rows(O, t_idx, qh, stride_ot, stride_oh, folded, l_run, row_ok, D, ON_M)
        if FUSED_MERGE:
            _merge_if_last(O, PM, PL, PACC, SEM, pid_m, b, h, t_idx, qh, row_ok, pos, last, n_split_grid, num_q_heads,
                           stride_ot, stride_oh, BQ, D, SPLIT)


@triton.jit
def _merge_rows(O, PM, PL, PACC, t_idx, qh, row_ok, pos, last, n_split_grid, num_q_heads, stride_ot, stride_oh,
                BQ: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr, CACHE: tl.constexpr):
    # A tile's rows: splits 0..n-1 folded with _fold into O. CACHE: the partials' load cache modifier; the fused merge
    # reads them through L2 (".cg"), as other programs wrote them during this launch.
    m_run = tl.full([BQ], float("-inf"), tl.float32)
    l_run = tl.zeros([BQ], tl.float32)
    acc_run = tl.zeros([D, BQ], tl.float32)
    for s_idx in range(last // SPLIT + 1):
        live = pos >= s_idx * SPLIT
        p_idx = (t_idx * num_q_heads + qh) * n_split_grid + s_idx
        m = tl.load(PM + p_idx, mask=live, other=float("-inf"), cache_modifier=CACHE)
        l = tl.load(PL + p_idx, mask=live, other=0.0, cache_modifier=CACHE)
        acc = tl.load(_rows_ptrs(PACC, p_idx, 0, D, 0, D, False), mask=live[None, :], other=0.0,
                      cache_modifier=CACHE)
        m_run, l_run, acc_run = _fold(m_run, l_run, acc_run, m, l, acc, live, False)
    _store_rows(O, t_idx, qh, stride_ot, stride_oh, acc_run, l_run, row_ok, D, False)


@triton.jit
def _merge_if_last(O, PM, PL, PACC, SEM, pid_m, b, h, t_idx, qh, row_ok, pos, last, n_split_grid, num_q_heads,
                   stride_ot, stride_oh, BQ: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr):
    # The fused merge: each of a tile's n_split_grid programs counts itself in on the tile's integer counter once its
    # partials are stored; the last to arrive merges (_merge_rows, the merge kernel's code) and sets the counter back
    # to 0 for the next launch. Which program merges follows the timing; what it computes and in which order does
    # not. The barrier makes every thread's stores precede the release of the counter's add; its acquire makes them
    # visible to the merging program.
    tl.debug_barrier()
    counter = SEM + (b * (tl.num_programs(2) // n_split_grid) + h) * tl.num_programs(0) + pid_m
    if tl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == n_split_grid - 1:
        tl.store(counter, 0)
        _merge_rows(O, PM, PL, PACC, t_idx, qh, row_ok, pos, last, n_split_grid, num_q_heads, stride_ot, stride_oh,
                    BQ, D, SPLIT, ".cg")


@triton.jit
def _merge_splits_kernel(O, PM, PL, PACC, cu_seqlens_q, context_lens, n_split_grid, num_q_heads, stride_ot,
                           stride_oh, G: tl.constexpr, BQ: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr):
    # grid (query tiles, B, Hkv): the attention kernel's rows, folding splits 0..n-1 with the same _fold.
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    has_rows, t_idx, g, row_ok, pos, last, _ = _rows(cu_seqlens_q, context_lens, b, pid_m, G, BQ)
    if has_rows:
        _merge_rows(O, PM, PL, PACC, t_idx, h * G + g, row_ok, pos, last, n_split_grid, num_q_heads, stride_ot,
                    stride_oh, BQ, D, SPLIT, "")


def _check_attention(q, k_cache, v_cache, meta) -> None:
    what = f"paged_attention[triton](q {tuple(q.shape)} {q.dtype} on {q.device}, cache {tuple(k_cache.shape)})"
    assert q.stride(2) == 1, f"{what}: q's head dim must be contiguous, strides {q.stride()}"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), f"{what}: caches must be contiguous"
    assert q.shape[2] in HEAD_DIMS, f"{what}: head_dim must be one of {HEAD_DIMS}"
    for name in ("cu_seqlens_q", "context_lens", "block_tables"):
        t = getattr(meta, name)
        assert t.dtype == torch.int32 and t.device == q.device, f"{what}: meta.{name} must be int32 on {q.device}"
    assert meta.block_tables.stride(1) == 1, f"{what}: block table rows must be contiguous"


# Pages that hold whole KV tiles load them through TMA descriptors (_tile_loads), masked tiles included: on the H200,
# decode 1-5 % faster than the gather from batch 32, prefill 8-10 % faster at 2048-8192 tokens, and 3-4 % faster than
# prefill tiles that gather only their masked (diagonal) tiles (docs/results/HISTORY.md §3). A module switch so that
# probes can time the gather beside it (scripts/attention_variants_probe.py). The same bits either way.
TMA_LOADS = True

# Decode launches of at least this many (sequence, KV head) programs fold up to FOLD_SPLITS splits in each program
# instead of running them in parallel and merging: on the H200 folding was faster at batch 32, 64 and 256 x 2048
# tokens and slower below 32 x 8 programs; longer contexts stay parallel, so one long sequence is never walked by one
# program alone (docs/results/attention_variants.h200.deferred.json). The bits are the same either way.
FOLD_PROGRAMS = 256
FOLD_SPLITS = 2

# Decode launches with splits in parallel merge them in their last program (_merge_if_last) instead of a merge
# kernel: on the H200 that saves the merge launch, 5-7 % of a decode whose splits run in parallel, bit for bit
# (docs/results/HISTORY.md §3). A module switch so that tests and probes can run the merge kernel beside it
# (tests/kernels/triton/test_attention.py).
FUSED_MERGE = True
# The fused merge's counters: int32 per (query tile, sequence, KV head) of a launch, zero between launches (the merging
# program resets its own). One buffer per device, so launches that share a device must be ordered, as on one stream
# (the engine's are, its graph warm-up stream included); allocated outside any CUDA graph capture, where a launch that
# finds none (or too few) runs the merge kernel instead.
_COUNTERS: dict[torch.device, torch.Tensor] = {}
MIN_COUNTERS = 1 << 16


# Decode launches of at most this many programs run the Gluon tile (attention_gluon.py) on Hopper, in 16-bit dtypes on
# pages of whole KV tiles: the same bits, the next tile's scores in flight during the softmax. On the H200 it was
# faster up to 128 programs (8 x 2048) and slower from 256 (1 x 32768, 32 x 2048), where programs share SMs
# (docs/results/gluon_decode.h200.json, docs/BENCHMARKS.md §3). 0 turns it off.
GLUON_PROGRAMS = 128


@functools.cache
def _hopper(device: torch.device) -> bool:
    return torch.cuda.get_device_capability(device)[0] == 9


def _gluon_decode(q, k_cache, meta, rows: int, parallel_splits: bool) -> bool:
    """Whether this launch takes the Gluon decode tile (GLUON_PROGRAMS)."""
    if rows >= ROWS_ON_M or meta.max_query_len * (q.shape[1] // k_cache.shape[2]) > rows:
        return False  # prefill tiles, or decode tiles forced onto several query tiles a sequence (never tested there)
    if k_cache.shape[1] % BLOCK_N or q.dtype not in (torch.float16, torch.bfloat16):
        return False
    if not q.is_cuda or interpreting() or not _hopper(q.device):
        return False
    n_split_grid = cdiv(meta.max_context_len, SPLIT) if parallel_splits else 1
    return meta.num_seqs * k_cache.shape[2] * n_split_grid <= GLUON_PROGRAMS


def default_parallel_splits(meta, tokens_per_tile: int, kv_heads: int) -> bool:
    """Decode-shaped batches run their splits in parallel, except many programs' short contexts (FOLD_PROGRAMS);
    the bits are the same either way (tested)."""
    if meta.max_query_len > tokens_per_tile or meta.max_context_len <= SPLIT:
        return False
    return meta.num_seqs * kv_heads < FOLD_PROGRAMS or meta.max_context_len > FOLD_SPLITS * SPLIT


def tile_rows(max_query_len: int, g: int) -> int:
    """Query rows per tile: the decode tile when one tile holds every new token's GQA heads, else the prefill tile;
    never fewer than the group (a power of two, as tl.arange needs). The bits do not depend on it."""
    rows = DECODE_ROWS if max_query_len * g <= DECODE_ROWS else ROWS
    return max(rows, next_pow2(g))


def paged_attention(q, k_cache, v_cache, meta, scale: float, parallel_splits: bool | None = None,
                    rows: int | None = None, split_decodes: bool | None = None) -> torch.Tensor:
    """q [T, Hq, D] -> [T, Hq, D]; caches [NB, BS, Hkv, D]. parallel_splits and rows pick by shape when None.
    split_decodes (by default when rows is not forced): a mixed batch's leading one-token sequences
    (meta.leading_decodes) run as their own decode-tile launch, the rest as the prefill launch. The bits are the same either way (tests/kernels/triton/test_attention.py)."""
    _check_attention(q, k_cache, v_cache, meta)
    out = torch.empty_like(q)
    if split_decodes is None:
        split_decodes = rows is None
    n_dec = meta.leading_decodes if split_decodes else 0
    g = q.shape[1] // k_cache.shape[2]
    if 0 < n_dec < meta.num_seqs and tile_rows(meta.max_query_len, g) != tile_rows(1, g):
        head, rest = meta.decodes_and_rest  # the kernel reads token offsets from cu_seqlens_q
        _launch(q[:n_dec], k_cache, v_cache, head, scale, out[:n_dec], parallel_splits, None)
        _launch(q, k_cache, v_cache, rest, scale, out, parallel_splits, rows)
    else:
        _launch(q, k_cache, v_cache, meta, scale, out, parallel_splits, rows)
    return out


def _counters(device: torch.device, n: int) -> torch.Tensor | None:
    """At least n zeroed counters on `device`, or None inside a capture that would have to allocate them."""
    have = _COUNTERS.get(device)
    if have is not None and have.numel() >= n:
        return have
    cuda = device.type == "cuda"
    if cuda and torch.cuda.is_current_stream_capturing():
        return None
    counters = torch.zeros(max(n, MIN_COUNTERS), dtype=torch.int32, device=device)
    if cuda:  # zeroed before any stream's launch can read it, whichever stream it was allocated on
        torch.cuda.synchronize(device)
    _COUNTERS[device] = counters
    return counters


def _descriptor(cache: torch.Tensor, d: int) -> TensorDescriptor:
    """A [NB, BS, Hkv, D] cache as [NB * BS, Hkv * D] rows, copied a KV tile of one head at a time."""
    return TensorDescriptor.from_tensor(cache.view(-1, cache.shape[2] * d), [BLOCK_N, d])


def _launch(q, k_cache, v_cache, meta, scale: float, out, parallel_splits: bool | None, rows: int | None) -> None:
    """The kernel over meta's sequences, whose new tokens are rows of q, into the same rows of out."""
    t, hq, d = q.shape
    h_kv = k_cache.shape[2]
    g = hq // h_kv
    rows = rows or tile_rows(meta.max_query_len, g)
    tokens_per_tile = rows // g
    if parallel_splits is None:
        parallel_splits = default_parallel_splits(meta, tokens_per_tile, h_kv)
    n_split_grid = cdiv(meta.max_context_len, SPLIT) if parallel_splits else 1
    on_m = rows >= ROWS_ON_M
    run_in_memory = on_m and not parallel_splits  # touched only where a tile's rows reach a second split
    if parallel_splits:
        pm = torch.empty(t, hq, n_split_grid, dtype=torch.float32, device=q.device)
        pl = torch.empty_like(pm)
        pacc = torch.empty(t, hq, n_split_grid, d, dtype=torch.float32, device=q.device)
    else:
        pm = pl = pacc = out  # unused by the folding variant
    multi_split = run_in_memory and meta.max_context_len > SPLIT
    run = torch.empty(t, hq, d, dtype=torch.float32, device=q.device) if multi_split else out
    grid = (cdiv(meta.max_query_len, tokens_per_tile), meta.num_seqs, h_kv * n_split_grid)
    sem = None
    if parallel_splits and not on_m and FUSED_MERGE:
        sem = _counters(q.device, grid[0] * grid[1] * h_kv)
    if _gluon_decode(q, k_cache, meta, rows, parallel_splits):
        from samebits.kernels.triton import attention_gluon

        attention_gluon.decode(grid, q, k_cache, v_cache, meta, float(scale) * LOG2E, out, pm, pl, pacc, sem,
                               parallel_splits, n_split_grid, rows, BLOCK_N, SPLIT, FP_FUSION)
    else:
        _launch_triton(grid, q, k_cache, v_cache, meta, scale, out, pm, pl, pacc, run, sem, parallel_splits,
                       n_split_grid, rows, on_m, run_in_memory)
    if parallel_splits and sem is None:
        _merge_splits_kernel[grid[:2] + (h_kv,)](
            out, pm, pl, pacc, meta.cu_seqlens_q, meta.context_lens, n_split_grid, hq, out.stride(0), out.stride(1),
            G=g, BQ=rows, D=d, SPLIT=SPLIT, num_warps=NUM_WARPS, enable_fp_fusion=FP_FUSION)


def _launch_triton(grid, q, k_cache, v_cache, meta, scale: float, out, pm, pl, pacc, run, sem, parallel_splits: bool,
                   n_split_grid: int, rows: int, on_m: bool, run_in_memory: bool) -> None:
    """_paged_attention_kernel over grid with _launch's buffers."""
    hq, d = q.shape[1], q.shape[2]
    bs, g = k_cache.shape[1], hq // k_cache.shape[2]
    upcast = interpreting()  # the interpreter's bf16/fp16 arithmetic is not the GPU's: compute in fp32 there
    precision = "ieee" if upcast or q.dtype == torch.float32 else "tf32"  # fp32 operands: exact products, never tf32
    tma = TMA_LOADS and bs % BLOCK_N == 0
    kd, vd = (_descriptor(k_cache, d), _descriptor(v_cache, d)) if tma else (None, None)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, kd, vd, out, pm, pl, pacc, run, out if sem is None else sem, meta.cu_seqlens_q,
        meta.context_lens, meta.block_tables, float(scale) * LOG2E, n_split_grid, hq, q.stride(0), q.stride(1),
        out.stride(0), out.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], meta.block_tables.stride(0),
        G=g, BQ=rows, BLOCK_N=BLOCK_N, D=d, BS=bs, SPLIT=SPLIT, PARTIAL=parallel_splits,
        UPCAST=upcast, PRECISION=precision, ON_M=on_m, RUN_IN_MEMORY=run_in_memory, TMA=tma,
        FUSED_MERGE=sem is not None, num_warps=PREFILL_WARPS if on_m else NUM_WARPS, num_stages=NUM_STAGES,
        enable_fp_fusion=FP_FUSION)
