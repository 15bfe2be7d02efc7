"""Decode attention in Gluon (Triton's tile-level dialect, Hopper): attention.py's decode tile with the next tile's
scores in flight during this tile's softmax.

The arithmetic is _paged_attention_kernel's rows-on-N tile (S^T = K Q^T, O^T = V^T P^T, the row sums through a ones
MMA, splits folded with _fold, the fused merge on the same counters), operation for operation on the same values in
the same order, so it gives the same bits (tests/kernels/triton/test_attention_gluon.py); only when each instruction
is issued and waited on differs. attention.py's Triton code waits on every MMA group as it is issued (one
wgmma.wait_group 0 after each tl.dot); here iteration j issues tile j+1's scores, runs tile j's softmax meanwhile,
then issues tile j's P V and row sums and waits once for all three. On the H200 that took decode 8-12 % less time
where few programs each walk a chain of tiles (batch 1, 8 x 512) and up to 14 % more where programs share SMs
(its 4 stages take 137 KB of shared memory, one program per SM): attention.py's GLUON_PROGRAMS picks it by the
launch's program count (docs/BENCHMARKS.md section 3). Pages of whole KV tiles (TMA), 16-bit dtypes, head dims 64
and 128.
"""
from __future__ import annotations

import torch
from triton.experimental import gluon
from triton.experimental.gluon import language as gl
from triton.experimental.gluon.language.nvidia.hopper import (
    fence_async_shared,
    mbarrier,
    tma,
    warpgroup_mma,
    warpgroup_mma_wait,
)
from triton.experimental.gluon.nvidia.hopper import TensorDescriptor

# The decode tile's wgmma layout: one warpgroup, instructions of 64 x 16 x 16 (attention.py's, read from its TTGIR).
MMA = gl.constexpr(gl.NVMMADistributedLayout(version=[3, 0], warps_per_cta=[4, 1], instr_shape=[16, 16, 16]))
ROW = gl.constexpr(gl.SliceLayout(0, MMA))  # [BQ]: the tile's query rows, on the MMA's N side
KEY = gl.constexpr(gl.SliceLayout(1, MMA))  # [BLOCK_N] or [D]: the M side
A_REG = gl.constexpr(gl.DotOperandLayout(operand_index=0, parent=MMA, k_width=2))
QBL = gl.constexpr(gl.BlockedLayout([8, 1], [16, 2], [1, 4], [0, 1]))  # Q^T [D, BQ] from global
VBL = gl.constexpr(gl.BlockedLayout([1, 8], [2, 16], [4, 1], [1, 0]))  # a V tile [BLOCK_N, D] through registers
NUM_WARPS = 4
# Names Triton changed after 3.6 (the H200 image's): the CTA barrier (gl.barrier later, as the CPU CI's Triton, whose
# PTX audit compiles this tile too, has it) and the TMA load.
_cta_barrier = getattr(gl, "thread_barrier", None) or gl.barrier
_tma_load = getattr(tma, "async_load", None) or tma.async_copy_global_to_shared  # renamed likewise
# K/V tiles in flight. Tile j+1's scores are issued at the start of tile j, a tile earlier than in attention.py, so the
# copies run a stage further ahead: at 3 stages the KV's latency from HBM showed (docs/results/HISTORY.md §3).
STAGES = 4


@gluon.jit
def _issue(KD, VD, k_s, v_s, bars, g, blk, n0, h, ok, BLOCK_N: gl.constexpr, D: gl.constexpr, BS: gl.constexpr,
           STAGES: gl.constexpr):
    # The TMA copies of the tile of keys n0.. (the program's g-th) into its stage, if ok.
    st = g % STAGES
    mbarrier.expect(bars.index(st), 2 * KD.block_type.nbytes, pred=ok)
    r0 = blk * BS + n0 % BS
    _tma_load(KD, [r0, h * D], bars.index(st), k_s.index(st), pred=ok)
    _tma_load(VD, [r0, h * D], bars.index(st), v_s.index(st), pred=ok)


@gluon.jit
def _block_id(bt_row, n0, hi, BS: gl.constexpr):
    return gl.load(bt_row + n0 // BS, mask=n0 < hi, other=0)


@gluon.jit
def _prologue(k_s, v_s, bars, KD, VD, bt_row, kv_lo, kv_hi, h, g0, BLOCK_N: gl.constexpr, D: gl.constexpr,
              BS: gl.constexpr, STAGES: gl.constexpr):
    # The copies of a split's first STAGES - 1 tiles (3 or 4 stages); returns the block id of the next. Every block
    # id is loaded before the first copy is issued, so their latencies overlap.
    gl.static_assert(STAGES == 3 or STAGES == 4, "the prologue is written for 3 or 4 stages")
    n1 = kv_lo + BLOCK_N
    n2 = kv_lo + 2 * BLOCK_N
    n3 = kv_lo + 3 * BLOCK_N
    b0 = _block_id(bt_row, kv_lo, kv_hi, BS)
    b1 = _block_id(bt_row, n1, kv_hi, BS)
    b2 = _block_id(bt_row, n2, kv_hi, BS)
    if STAGES == 4:
        b3 = _block_id(bt_row, n3, kv_hi, BS)
    _issue(KD, VD, k_s, v_s, bars, g0, b0, kv_lo, h, kv_lo < kv_hi, BLOCK_N, D, BS, STAGES)
    _issue(KD, VD, k_s, v_s, bars, g0 + 1, b1, n1, h, n1 < kv_hi, BLOCK_N, D, BS, STAGES)
    if STAGES == 4:
        _issue(KD, VD, k_s, v_s, bars, g0 + 2, b2, n2, h, n2 < kv_hi, BLOCK_N, D, BS, STAGES)
        b2 = b3
    return b2


@gluon.jit
def _split(q_s, k_s, v_s, p_s, bars, KD, VD, bt_row, kv_lo, kv_hi, last, pos, h, qk_scale, g0, blk_ahead,
           BQ: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, BS: gl.constexpr, STAGES: gl.constexpr):
    # Keys kv_lo..kv_hi-1 folded tile by tile in order: (m, l, acc) as attention.py's _fold_tiles with MASKED (which
    # gives every row the unmasked tile's bits where all its keys are visible), after _prologue's copies. g0: the
    # program's tiles so far, which set each tile's stage and barrier phase.
    dt: gl.constexpr = k_s.dtype
    n_tiles = (kv_hi - kv_lo + BLOCK_N - 1) // BLOCK_N
    ones = gl.full([64, BLOCK_N], 1.0, dt, A_REG)
    s_zero = gl.zeros([BLOCK_N, BQ], gl.float32, MMA)
    mbarrier.wait(bars.index(g0 % STAGES), (g0 // STAGES) & 1)
    s_tok = warpgroup_mma(k_s.index(g0 % STAGES), q_s, s_zero, use_acc=False, is_async=True)
    s = warpgroup_mma_wait(0, deps=(s_tok, ))
    m = gl.full([BQ], float("-inf"), gl.float32, ROW)
    l2 = gl.zeros([64, BQ], gl.float32, MMA)
    acc = gl.zeros([D, BQ], gl.float32, MMA)
    for j in range(n_tiles):
        g = g0 + j
        n0 = kv_lo + j * BLOCK_N
        # Tile j+1's scores (after the last tile, tile j's again: a result never read), in flight during tile j's
        # softmax. No MMA stays in flight across iterations: ptxas serialises every wgmma of a loop whose carried
        # values hold an unfinished accumulator (C7514).
        g_next = g + (j + 1 < n_tiles).to(gl.int32)
        mbarrier.wait(bars.index(g_next % STAGES), (g_next // STAGES) & 1)
        s_tok = warpgroup_mma(k_s.index(g_next % STAGES), q_s, s_zero, use_acc=False, is_async=True)
        n = n0 + gl.arange(0, BLOCK_N, KEY)
        s = s * qk_scale
        s = gl.where(n[:, None] <= pos[None, :], s, float("-inf"))
        m_new = gl.maximum(m, gl.max(s, 0))
        live = pos >= n0
        m_safe = gl.where(live, m_new, 0.0)
        alpha = gl.exp2(m - m_safe)
        p = gl.exp2(s - m_safe[None, :]).to(dt)
        # Tile j-1's stage is free (its MMAs finished last iteration): tile j+STAGES-1 into it.
        n_ahead = n0 + (STAGES - 1) * BLOCK_N
        _issue(KD, VD, k_s, v_s, bars, g + STAGES - 1, blk_ahead, n_ahead, h, n_ahead < kv_hi, BLOCK_N, D, BS, STAGES)
        blk_ahead = _block_id(bt_row, n_ahead + BLOCK_N, kv_hi, BS)
        st = g % STAGES
        if n0 + BLOCK_N - 1 > last:
            # A copy's box cannot mask keys: the slots past `last` hold whatever they hold (NaN at worst), and
            # 0 * NaN would reach the output, so V's are zeroed in place (attention.py's _tile_loads).
            v = v_s.index(st).load(VBL)
            nv = n0 + gl.arange(0, BLOCK_N, gl.SliceLayout(1, VBL))
            v_s.index(st).store(gl.where(nv[:, None] <= last, v, 0.0))
        p_s.store(p)
        fence_async_shared()
        _cta_barrier()
        l2_tok = warpgroup_mma(ones, p_s, l2 * alpha[None, :], is_async=True)
        acc_tok = warpgroup_mma(v_s.index(st).permute((1, 0)), p_s, acc * alpha[None, :], is_async=True)
        s, l2_new, acc_new = warpgroup_mma_wait(0, deps=(s_tok, l2_tok, acc_tok))
        l2 = gl.where(live[None, :], l2_new, l2)
        acc = gl.where(live[None, :], acc_new, acc)
        m = gl.where(live, m_new, m)
    l = gl.sum(gl.where(gl.arange(0, 64, KEY)[:, None] == 0, l2, 0.0), 0)
    return m, l, acc, g0 + n_tiles


@gluon.jit
def _fold(m_r, l_r, acc_r, m_s, l_s, acc_s, live):
    # attention.py's _fold for rows on N.
    m = gl.maximum(m_r, m_s)
    m_safe = gl.where(live, m, 0.0)
    a = gl.exp2(m_r - m_safe)
    b = gl.exp2(m_s - m_safe)
    l = gl.fma(l_r, a, l_s * b)
    acc = gl.where(live[None, :], gl.fma(acc_r, a[None, :], acc_s * b[None, :]), acc_r)
    return gl.where(live, m, m_r), gl.where(live, l, l_r), acc


@gluon.jit
def _merge_rows(O, PM, PL, PACC, t_idx, qh, row_ok, pos, last, n_split_grid, num_q_heads, stride_ot, stride_oh,
                BQ: gl.constexpr, D: gl.constexpr, SPLIT: gl.constexpr):
    # attention.py's _merge_rows (rows on N, partials read through L2): splits 0..n-1 folded with _fold into O.
    d = gl.arange(0, D, KEY)
    m_run = gl.full([BQ], float("-inf"), gl.float32, ROW)
    l_run = gl.zeros([BQ], gl.float32, ROW)
    acc_run = gl.zeros([D, BQ], gl.float32, MMA)
    for s_idx in range(last // SPLIT + 1):
        live = pos >= s_idx * SPLIT
        p_idx = (t_idx * num_q_heads + qh) * n_split_grid + s_idx
        m = gl.load(PM + p_idx, mask=live, other=float("-inf"), cache_modifier=".cg")
        l = gl.load(PL + p_idx, mask=live, other=0.0, cache_modifier=".cg")
        acc = gl.load(PACC + p_idx[None, :] * D + d[:, None], mask=live[None, :], other=0.0, cache_modifier=".cg")
        m_run, l_run, acc_run = _fold(m_run, l_run, acc_run, m, l, acc, live)
    _store_rows(O, t_idx, qh, stride_ot, stride_oh, acc_run, l_run, row_ok, D)


@gluon.jit
def _store_rows(O, t_idx, qh, stride_ot, stride_oh, acc, l, row_ok, D: gl.constexpr):
    # attention.py's _store_rows: acc / l (rows with no key: 0) in O's dtype.
    d = gl.arange(0, D, KEY)
    l_safe = gl.where(l > 0, l, 1.0)
    out = acc / l_safe[None, :]
    gl.store(O + (t_idx * stride_ot + qh * stride_oh)[None, :] + d[:, None], out.to(O.dtype.element_ty),
             mask=row_ok[None, :])


@gluon.jit
def _merge_if_last(O, PM, PL, PACC, SEM, pid_m, b, h, t_idx, qh, row_ok, pos, last, n_split_grid, num_q_heads,
                   stride_ot, stride_oh, BQ: gl.constexpr, D: gl.constexpr, SPLIT: gl.constexpr):
    # attention.py's _merge_if_last on the same counters: the last of a tile's split programs to count itself in
    # merges; which one follows the timing, what it computes does not.
    _cta_barrier()
    counter = SEM + (b * (gl.num_programs(2) // n_split_grid) + h) * gl.num_programs(0) + pid_m
    if gl.atomic_add(counter, 1, sem="acq_rel", scope="gpu") == n_split_grid - 1:
        gl.store(counter, 0)
        _merge_rows(O, PM, PL, PACC, t_idx, qh, row_ok, pos, last, n_split_grid, num_q_heads, stride_ot, stride_oh,
                    BQ, D, SPLIT)


@gluon.jit
def _decode_kernel(Q, KD, VD, O, PM, PL, PACC, SEM, cu_seqlens_q, context_lens, block_tables, qk_scale, n_split_grid,
                   num_q_heads, stride_qt, stride_qh, stride_ot, stride_oh, stride_bt,
                   G: gl.constexpr, BQ: gl.constexpr, BLOCK_N: gl.constexpr, D: gl.constexpr, BS: gl.constexpr,
                   SPLIT: gl.constexpr, PARTIAL: gl.constexpr, STAGES: gl.constexpr, FUSED_MERGE: gl.constexpr):
    # attention.py's _paged_attention_kernel with rows on N and TMA loads: grid (query tiles, B, Hkv * n_split_grid);
    # PARTIAL: split `sid` only, into PM/PL/PACC, merged by the last of a tile's split programs (FUSED_MERGE,
    # _merge_if_last) or by attention.py's merge kernel.
    pid_m = gl.num_programs(0) - 1 - gl.program_id(0)
    b = gl.program_id(1)
    h = gl.program_id(2) // n_split_grid
    sid = gl.program_id(2) % n_split_grid
    TM: gl.constexpr = BQ // G
    q_start = gl.load(cu_seqlens_q + b)
    n_new = gl.load(cu_seqlens_q + b + 1) - q_start
    ctx = gl.load(context_lens + b)
    tok0 = pid_m * TM
    if tok0 < n_new:
        # attention.py's _rows and split range, in Gluon's layouts (a @gluon.jit kernel cannot call @triton.jit code).
        r = gl.arange(0, BQ, ROW)
        tq = tok0 + r // G
        row_ok = (r < TM * G) & (tq < n_new)
        first = ctx - n_new
        pos = gl.where(row_ok, first + tq, -1)
        last = gl.minimum(first + tok0 + TM - 1, ctx - 1)
        t_idx = (q_start + tq).to(gl.int64)
        qh = h * G + r % G
        dt: gl.constexpr = Q.dtype.element_ty

        n_splits = last // SPLIT + 1
        lo_split = 0
        hi_split = n_splits
        if PARTIAL:
            lo_split = sid
            hi_split = gl.minimum(sid + 1, n_splits)
        bt_row = block_tables + b * stride_bt
        # Q is loaded first and stored after the first copies are issued, so its latency and the block ids' overlap.
        rq = gl.arange(0, BQ, gl.SliceLayout(0, QBL))
        tq_q = tok0 + rq // G
        ok_q = (rq < TM * G) & (tq_q < n_new)
        d_q = gl.arange(0, D, gl.SliceLayout(1, QBL))
        q_ptrs = Q + ((q_start + tq_q).to(gl.int64) * stride_qt + (h * G + rq % G) * stride_qh)[None, :] + d_q[:, None]
        q = gl.load(q_ptrs, mask=ok_q[None, :], other=0.0)
        k_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, D], KD.layout)
        v_s = gl.allocate_shared_memory(dt, [STAGES, BLOCK_N, D], VD.layout)
        p_s = gl.allocate_shared_memory(dt, [BLOCK_N, BQ], gl.NVMMASharedLayout(32, 16, 2, False))
        bars = gl.allocate_shared_memory(gl.int64, [STAGES, 1], mbarrier.MBarrierLayout())
        for i in gl.static_range(STAGES):
            mbarrier.init(bars.index(i), count=1)
        fence_async_shared()
        _cta_barrier()
        kv_lo = lo_split * SPLIT
        blk_ahead = _prologue(k_s, v_s, bars, KD, VD, bt_row, kv_lo, gl.minimum(kv_lo + SPLIT, last + 1), h, 0,
                              BLOCK_N, D, BS, STAGES)
        q_s = gl.allocate_shared_memory(dt, [D, BQ], gl.NVMMASharedLayout(128, 16, 2, True), q)
        fence_async_shared()
        _cta_barrier()

        d = gl.arange(0, D, KEY)
        m_run = gl.full([BQ], float("-inf"), gl.float32, ROW)
        l_run = gl.zeros([BQ], gl.float32, ROW)
        acc_run = gl.zeros([D, BQ], gl.float32, MMA)
        g = gl.to_tensor(0)
        for s_idx in range(lo_split, hi_split):
            kv_lo = s_idx * SPLIT
            kv_hi = gl.minimum(kv_lo + SPLIT, last + 1)
            if s_idx > lo_split:
                blk_ahead = _prologue(k_s, v_s, bars, KD, VD, bt_row, kv_lo, kv_hi, h, g, BLOCK_N, D, BS, STAGES)
            m, l, acc, g = _split(q_s, k_s, v_s, p_s, bars, KD, VD, bt_row, kv_lo, kv_hi, last, pos, h, qk_scale, g,
                                  blk_ahead, BQ, BLOCK_N, D, BS, STAGES)
            if PARTIAL:
                ok = row_ok & (pos >= kv_lo)
                p_idx = (t_idx * num_q_heads + qh) * n_split_grid + s_idx
                gl.store(PM + p_idx, m, mask=ok)
                gl.store(PL + p_idx, l, mask=ok)
                gl.store(PACC + p_idx[None, :] * D + d[:, None], acc, mask=ok[None, :])
            else:
                m_run, l_run, acc_run = _fold(m_run, l_run, acc_run, m, l, acc, pos >= kv_lo)
        if FUSED_MERGE:
            _merge_if_last(O, PM, PL, PACC, SEM, pid_m, b, h, t_idx, qh, row_ok, pos, last, n_split_grid,
                           num_q_heads, stride_ot, stride_oh, BQ, D, SPLIT)
        if not PARTIAL:
            _store_rows(O, t_idx, qh, stride_ot, stride_oh, acc_run, l_run, row_ok, D)
        for i in gl.static_range(STAGES):
            mbarrier.invalidate(bars.index(i))


def _descriptor(cache: torch.Tensor, d: int, block_n: int) -> TensorDescriptor:
    """A [NB, BS, Hkv, D] cache as [NB * BS, Hkv * D] rows, copied a KV tile of one head at a time."""
    flat = cache.view(-1, cache.shape[2] * d)
    layout = gl.NVMMASharedLayout.get_default_for([block_n, d], gl.bfloat16 if cache.dtype == torch.bfloat16
                                                  else gl.float16)
    return TensorDescriptor(flat, list(flat.shape), list(flat.stride()), [block_n, d], layout)


def decode(grid, q, k_cache, v_cache, meta, qk_scale: float, out, pm, pl, pacc, sem, parallel_splits: bool,
           n_split_grid: int, rows: int, block_n: int, split: int, fp_fusion: bool) -> None:
    """The decode tile over grid (query tiles, B, Hkv * n_split_grid), launched by attention.py's _launch with its
    buffers: partials pm/pl/pacc where splits run in parallel (merged here when sem holds the fused merge's counters,
    else by attention.py's merge kernel), qk_scale already in base 2."""
    hq, d = q.shape[1], q.shape[2]
    bs, g = k_cache.shape[1], hq // k_cache.shape[2]
    what = f"attention_gluon.decode(q {tuple(q.shape)} {q.dtype}, cache {tuple(k_cache.shape)}, {rows} rows)"
    assert meta.max_query_len * g <= rows, f"{what}: the new tokens need several query tiles a sequence"
    assert bs % block_n == 0, f"{what}: pages of {bs} tokens do not hold whole {block_n}-token tiles"
    assert q.dtype in (torch.bfloat16, torch.float16), f"{what}: 16-bit dtypes only"
    _decode_kernel[grid](
        q, _descriptor(k_cache, d, block_n), _descriptor(v_cache, d, block_n), out, pm, pl, pacc,
        out if sem is None else sem, meta.cu_seqlens_q, meta.context_lens, meta.block_tables, qk_scale, n_split_grid,
        hq, q.stride(0), q.stride(1), out.stride(0), out.stride(1), meta.block_tables.stride(0),
        G=g, BQ=rows, BLOCK_N=block_n, D=d, BS=bs, SPLIT=split, PARTIAL=parallel_splits,
        STAGES=STAGES, FUSED_MERGE=sem is not None, num_warps=NUM_WARPS, enable_fp_fusion=fp_fusion)
