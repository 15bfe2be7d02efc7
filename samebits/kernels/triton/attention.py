"""Triton paged attention and its split merge (the why of the tiles: samebits/kernels/attention.py).

Tiles are transposed: S^T = K Q^T and O^T = V^T P^T, so the MMA's M side is always the 64-key tile or the head dim and
the query rows are its N side. A row's bits are then the same at every query-tile width (measured on the H200 at 16, 32,
64 and 128 rows, scripts/attention_rows_probe.py), so decode runs 16-row tiles (4 GQA heads of one token use 4 of 16
rows, not 4 of 64) and prefill 64-row ones, with prefill and decode still bit-equal.

Imported lazily (only on CUDA or under TRITON_INTERPRET=1) so that importing samebits never needs triton. The launcher
checks shapes, dtypes and strides; the torch reference is kernels.attention.paged_attention_reference (float64).
No atomics: each output element is written by exactly one program.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.arith import cdiv
from samebits.kernels.common import interpreting, next_pow2
from samebits.kernels.configs import TILE_CONFIGS

_QT = TILE_CONFIGS["attention.query_tile"]["config"]
ROWS = _QT["rows"]
DECODE_ROWS = _QT["decode_rows"]
NUM_WARPS = _QT["num_warps"]
NUM_STAGES = _QT["num_stages"]
# Pinned: Triton's default for contracting a*b+c into fma changes across versions (3.10 flips it), and it changes bits.
FP_FUSION = _QT["fp_fusion"]
BLOCK_N = TILE_CONFIGS["attention.kv_tile"]["config"]["tokens"]
SPLIT = TILE_CONFIGS["attention.split_kv"]["config"]["tokens"]
assert SPLIT % BLOCK_N == 0, "a split must hold whole KV tiles"
HEAD_DIMS = (64, 128)  # the head dims with a fixed tile
DECODE_STAGES = _QT["decode_stages"]
LOG2E = 1.4426950408889634  # softmax runs in base 2: exp(x * scale) == exp2(x * scale * log2(e))


@triton.jit
def _tile_blocks(bt_row, n0, last, BLOCK_N: tl.constexpr, BS: tl.constexpr, MASKED: tl.constexpr):
    # The block id of each of the tile's keys (0 past `last`, where the loads are masked anyway); MASKED=False only
    # for tiles whose every key is at most `last`.
    n = n0 + tl.arange(0, BLOCK_N)
    if MASKED:
        return tl.load(bt_row + n // BS, mask=n <= last, other=0)
    return tl.load(bt_row + n // BS)


@triton.jit
def _tile_loads(K, V, blk32, n0, last, h, stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                BLOCK_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, MASKED: tl.constexpr):
    # K [BN, D] and V^T [D, BN] of keys n0..n0+BLOCK_N-1 gathered via their block ids blk32 (_tile_blocks); keys past
    # `last` read as 0 (no memory traffic), and every key of a tile is either read or beyond every row's reach.
    n = n0 + tl.arange(0, BLOCK_N)
    d = tl.arange(0, D)
    blk = blk32.to(tl.int64)
    row = blk * stride_kb + (n % BS) * stride_ks + h * stride_kh
    row_v = blk * stride_vb + (n % BS) * stride_vs + h * stride_vh
    if MASKED:
        kv_ok = n <= last
        k = tl.load(K + row[:, None] + d[None, :], mask=kv_ok[:, None], other=0.0)
        vt = tl.load(V + row_v[None, :] + d[:, None], mask=kv_ok[None, :], other=0.0)
    else:
        k = tl.load(K + row[:, None] + d[None, :])
        vt = tl.load(V + row_v[None, :] + d[:, None])
    return k, vt


@triton.jit
def _tile_math(qt, m, l, acc, k, vt, n0, pos, qk_scale, BLOCK_N: tl.constexpr, UPCAST: tl.constexpr,
               IEEE: tl.constexpr, MASKED: tl.constexpr):
    # qt [D, BQ]; m, l [BQ] fp32 (log2 domain); acc [D, BQ] fp32; k, vt one tile (_tile_loads).
    # MASKED=False is only used for tiles whose every key every live row sees: there the causal mask and the
    # live-row selects are identities, so both variants give a row the same bits (the diagonal tiles use MASKED).
    n = n0 + tl.arange(0, BLOCK_N)
    if UPCAST:
        k = k.to(tl.float32)
        vt = vt.to(tl.float32)
    if IEEE:
        st = tl.dot(k, qt, input_precision="ieee")
    else:
        st = tl.dot(k, qt)
    st = st * qk_scale  # [BN, BQ], log2 domain: softmax scale * log2(e) folded into one multiply
    if MASKED:
        st = tl.where(n[:, None] <= pos[None, :], st, float("-inf"))
        live = pos >= n0  # the tile holds at least one of the row's keys; other rows keep their state bit for bit
        m_new = tl.maximum(m, tl.max(st, 0))
        m_safe = tl.where(live, m_new, 0.0)
    else:
        m_new = tl.maximum(m, tl.max(st, 0))
        m_safe = m_new
    alpha = tl.exp2(m - m_safe)
    pt = tl.exp2(st - m_safe[None, :])  # [BN, BQ]
    l_new = tl.fma(l, alpha, tl.sum(pt, 0))
    acc_new = acc * alpha[None, :]
    if IEEE:
        acc_new = tl.dot(vt, pt.to(vt.dtype), acc_new, input_precision="ieee")
    else:
        acc_new = tl.dot(vt, pt.to(vt.dtype), acc_new)
    if MASKED:
        m_new = tl.where(live, m_new, m)
        l_new = tl.where(live, l_new, l)
        acc_new = tl.where(live[None, :], acc_new, acc)
    return m_new, l_new, acc_new


@triton.jit
def _fold(m_r, l_r, acc_r, m_s, l_s, acc_s, live):
    # The one merge formula, shared by the sequential fold and the merge kernel so both round identically.
    # m/l [BQ], acc [D, BQ]; rows where live is False keep the running state bit for bit.
    m = tl.maximum(m_r, m_s)
    m_safe = tl.where(live, m, 0.0)
    a = tl.exp2(m_r - m_safe)
    b = tl.exp2(m_s - m_safe)
    l = tl.fma(l_r, a, l_s * b)
    acc = tl.fma(acc_r, a[None, :], acc_s * b[None, :])
    return tl.where(live, m, m_r), tl.where(live, l, l_r), tl.where(live[None, :], acc, acc_r)


@triton.jit
def _fold_tiles(qt, m, l, acc, blk, K, V, bt_row, lo, hi, last, pos, h, qk_scale,
                stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                BLOCK_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
                AHEAD: tl.constexpr, MASKED: tl.constexpr):
    # Keys lo..hi-1 folded tile by tile in order. AHEAD: blk holds tile lo's block ids and each iteration loads the
    # next tile's (masked: it may pass `last`), returned for the next range; otherwise each tile loads its own and blk
    # passes through. The loads and the arithmetic are the same either way, and so are the bits.
    if AHEAD:
        for n0 in range(lo, hi, BLOCK_N):
            nxt = _tile_blocks(bt_row, n0 + BLOCK_N, last, BLOCK_N, BS, True)
            k, vt = _tile_loads(K, V, blk, n0, last, h, stride_kb, stride_ks, stride_kh,
                                stride_vb, stride_vs, stride_vh, BLOCK_N, D, BS, True)
            m, l, acc = _tile_math(qt, m, l, acc, k, vt, n0, pos, qk_scale, BLOCK_N, UPCAST, IEEE, MASKED)
            blk = nxt
    else:
        for n0 in range(lo, hi, BLOCK_N):
            ids = _tile_blocks(bt_row, n0, last, BLOCK_N, BS, MASKED)
            k, vt = _tile_loads(K, V, ids, n0, last, h, stride_kb, stride_ks, stride_kh,
                                stride_vb, stride_vs, stride_vh, BLOCK_N, D, BS, MASKED)
            m, l, acc = _tile_math(qt, m, l, acc, k, vt, n0, pos, qk_scale, BLOCK_N, UPCAST, IEEE, MASKED)
    return m, l, acc, blk


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
def _paged_attention_kernel(
        Q, K, V, O, PM, PL, PACC, cu_seqlens_q, context_lens, block_tables, qk_scale, n_split_grid, num_q_heads,
        stride_qt, stride_qh, stride_ot, stride_oh,
        stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh, stride_bt,
        G: tl.constexpr, BQ: tl.constexpr, BLOCK_N: tl.constexpr, D: tl.constexpr, BS: tl.constexpr,
        SPLIT: tl.constexpr, PARTIAL: tl.constexpr, UPCAST: tl.constexpr, IEEE: tl.constexpr,
        AHEAD: tl.constexpr):
    # grid (query tiles, B, Hkv * n_split_grid). PARTIAL: split `sid` only, (m, l, acc) to PM/PL [T, Hq, S] and
    # PACC [T, Hq, S, D]; otherwise every split folded in order into O [T, Hq, D]. AHEAD (decode tiles): block ids a
    # tile ahead, so the K/V copies never wait on the block table (_fold_tiles; tests/kernels/triton/test_attention.py).
    pid_m = tl.num_programs(0) - 1 - tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2) // n_split_grid
    sid = tl.program_id(2) % n_split_grid
    has_rows, t_idx, g, row_ok, pos, last, first_pos = _rows(cu_seqlens_q, context_lens, b, pid_m, G, BQ)
    if has_rows:
        qh = h * G + g
        d = tl.arange(0, D)
        qt = tl.load(Q + t_idx[None, :] * stride_qt + qh[None, :] * stride_qh + d[:, None],
                     mask=row_ok[None, :], other=0.0)  # [D, BQ]
        if UPCAST:
            qt = qt.to(tl.float32)
        n_splits = last // SPLIT + 1
        lo_split = 0
        hi_split = n_splits
        if PARTIAL:
            lo_split = sid
            hi_split = tl.minimum(sid + 1, n_splits)
        bt_row = block_tables + b * stride_bt
        m_run = tl.full([BQ], float("-inf"), tl.float32)
        l_run = tl.zeros([BQ], tl.float32)
        acc_run = tl.zeros([D, BQ], tl.float32)
        for s_idx in range(lo_split, hi_split):
            m = tl.full([BQ], float("-inf"), tl.float32)
            l = tl.zeros([BQ], tl.float32)
            acc = tl.zeros([D, BQ], tl.float32)
            kv_lo = s_idx * SPLIT
            kv_hi = tl.minimum(kv_lo + SPLIT, last + 1)
            full_hi = tl.minimum(kv_lo + tl.maximum(first_pos + 1 - kv_lo, 0) // BLOCK_N * BLOCK_N, kv_hi)
            blk = _tile_blocks(bt_row, kv_lo, last, BLOCK_N, BS, True)  # AHEAD's first ids; else unused, dropped
            m, l, acc, blk = _fold_tiles(qt, m, l, acc, blk, K, V, bt_row, kv_lo, full_hi, last, pos, h, qk_scale,
                                         stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                         BLOCK_N, D, BS, UPCAST, IEEE, AHEAD, False)
            m, l, acc, blk = _fold_tiles(qt, m, l, acc, blk, K, V, bt_row, full_hi, kv_hi, last, pos, h, qk_scale,
                                         stride_kb, stride_ks, stride_kh, stride_vb, stride_vs, stride_vh,
                                         BLOCK_N, D, BS, UPCAST, IEEE, AHEAD, True)
            if PARTIAL:
                ok = row_ok & (pos >= kv_lo)
                p_idx = (t_idx * num_q_heads + qh) * n_split_grid + s_idx  # [BQ]
                tl.store(PM + p_idx, m, mask=ok)
                tl.store(PL + p_idx, l, mask=ok)
                tl.store(PACC + p_idx[None, :] * D + d[:, None], acc, mask=ok[None, :])
            else:
                m_run, l_run, acc_run = _fold(m_run, l_run, acc_run, m, l, acc, pos >= kv_lo)
        if not PARTIAL:
            out = acc_run / tl.where(l_run > 0, l_run, 1.0)[None, :]
            tl.store(O + t_idx[None, :] * stride_ot + qh[None, :] * stride_oh + d[:, None],
                     out.to(O.dtype.element_ty), mask=row_ok[None, :])


@triton.jit
def _merge_splits_kernel(O, PM, PL, PACC, cu_seqlens_q, context_lens, n_split_grid, num_q_heads, stride_ot,
                           stride_oh, G: tl.constexpr, BQ: tl.constexpr, D: tl.constexpr, SPLIT: tl.constexpr):
    # grid (query tiles, B, Hkv): the attention kernel's rows, folding splits 0..n-1 with the same _fold.
    pid_m = tl.program_id(0)
    b = tl.program_id(1)
    h = tl.program_id(2)
    has_rows, t_idx, g, row_ok, pos, last, _ = _rows(cu_seqlens_q, context_lens, b, pid_m, G, BQ)
    if has_rows:
        qh = h * G + g
        d = tl.arange(0, D)
        m_run = tl.full([BQ], float("-inf"), tl.float32)
        l_run = tl.zeros([BQ], tl.float32)
        acc_run = tl.zeros([D, BQ], tl.float32)
        for s_idx in range(last // SPLIT + 1):
            live = pos >= s_idx * SPLIT
            p_idx = (t_idx * num_q_heads + qh) * n_split_grid + s_idx
            m = tl.load(PM + p_idx, mask=live, other=float("-inf"))
            l = tl.load(PL + p_idx, mask=live, other=0.0)
            acc = tl.load(PACC + p_idx[None, :] * D + d[:, None], mask=live[None, :], other=0.0)
            m_run, l_run, acc_run = _fold(m_run, l_run, acc_run, m, l, acc, live)
        out = acc_run / tl.where(l_run > 0, l_run, 1.0)[None, :]
        tl.store(O + t_idx[None, :] * stride_ot + qh[None, :] * stride_oh + d[:, None],
                 out.to(O.dtype.element_ty), mask=row_ok[None, :])


def _check_attention(q, k_cache, v_cache, meta) -> None:
    what = f"paged_attention[triton](q {tuple(q.shape)} {q.dtype} on {q.device}, cache {tuple(k_cache.shape)})"
    assert q.stride(2) == 1, f"{what}: q's head dim must be contiguous, strides {q.stride()}"
    assert k_cache.is_contiguous() and v_cache.is_contiguous(), f"{what}: caches must be contiguous"
    assert q.shape[2] in HEAD_DIMS, f"{what}: head_dim must be one of {HEAD_DIMS}"
    for name in ("cu_seqlens_q", "context_lens", "block_tables"):
        t = getattr(meta, name)
        assert t.dtype == torch.int32 and t.device == q.device, f"{what}: meta.{name} must be int32 on {q.device}"
    assert meta.block_tables.stride(1) == 1, f"{what}: block table rows must be contiguous"


# Decode launches of at least this many (sequence, KV head) programs fold up to FOLD_SPLITS splits in each program
# instead of running them in parallel and merging: on the H200, folded 2-split decode took 71.1 / 138.8 / 525.6 us
# against 77.7 / 146.1 / 542.2 parallel at batch 32 / 64 / 256 x 2048 tokens, and lost below 32 x 8 programs (8 x 2048:
# 50.5 against 30.3 us); longer contexts stay parallel, so one long sequence is never walked by one program alone
# (docs/results/attention_variants.h200.deferred.json). The bits are the same either way.
FOLD_PROGRAMS = 256
FOLD_SPLITS = 2


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
                    rows: int | None = None, ahead: bool | None = None,
                    split_decodes: bool | None = None) -> torch.Tensor:
    """q [T, Hq, D] -> [T, Hq, D]; caches [NB, BS, Hkv, D]. parallel_splits, rows and ahead (the block-ids-ahead
    loop, by default on decode tiles) pick by shape when None. split_decodes (by default when rows is not forced): a
    mixed batch's leading one-token sequences (meta.leading_decodes) run as their own decode-tile launch, the rest as
    the prefill launch. The bits are the same either way (tests/kernels/triton/test_attention.py)."""
    _check_attention(q, k_cache, v_cache, meta)
    out = torch.empty_like(q)
    if split_decodes is None:
        split_decodes = rows is None
    n_dec = meta.leading_decodes if split_decodes else 0
    g = q.shape[1] // k_cache.shape[2]
    if 0 < n_dec < meta.num_seqs and tile_rows(meta.max_query_len, g) != tile_rows(1, g):
        head, rest = meta.decodes_and_rest  # the kernel reads token offsets from cu_seqlens_q
        _launch(q[:n_dec], k_cache, v_cache, head, scale, out[:n_dec], parallel_splits, None, ahead)
        _launch(q, k_cache, v_cache, rest, scale, out, parallel_splits, rows, ahead)
    else:
        _launch(q, k_cache, v_cache, meta, scale, out, parallel_splits, rows, ahead)
    return out


def _launch(q, k_cache, v_cache, meta, scale: float, out, parallel_splits: bool | None, rows: int | None,
            ahead: bool | None) -> None:
    """The kernel over meta's sequences, whose new tokens are rows of q, into the same rows of out."""
    t, hq, d = q.shape
    bs, h_kv = k_cache.shape[1], k_cache.shape[2]
    g = hq // h_kv
    rows = rows or tile_rows(meta.max_query_len, g)
    tokens_per_tile = rows // g
    ahead = rows < ROWS if ahead is None else ahead
    if parallel_splits is None:
        parallel_splits = default_parallel_splits(meta, tokens_per_tile, h_kv)
    n_split_grid = cdiv(meta.max_context_len, SPLIT) if parallel_splits else 1
    if parallel_splits:
        pm = torch.empty(t, hq, n_split_grid, dtype=torch.float32, device=q.device)
        pl = torch.empty_like(pm)
        pacc = torch.empty(t, hq, n_split_grid, d, dtype=torch.float32, device=q.device)
    else:
        pm = pl = pacc = out  # unused by the folding variant
    upcast = interpreting()  # the interpreter's bf16/fp16 arithmetic is not the GPU's: compute in fp32 there
    ieee = upcast or q.dtype == torch.float32  # fp32 operands: exact fp32 products, never tf32
    grid = (cdiv(meta.max_query_len, tokens_per_tile), meta.num_seqs, h_kv * n_split_grid)
    _paged_attention_kernel[grid](
        q, k_cache, v_cache, out, pm, pl, pacc, meta.cu_seqlens_q, meta.context_lens, meta.block_tables,
        float(scale) * LOG2E, n_split_grid, hq, q.stride(0), q.stride(1), out.stride(0), out.stride(1),
        *k_cache.stride()[:3], *v_cache.stride()[:3], meta.block_tables.stride(0),
        G=g, BQ=rows, BLOCK_N=BLOCK_N, D=d, BS=bs, SPLIT=SPLIT, PARTIAL=parallel_splits,
        UPCAST=upcast, IEEE=ieee, AHEAD=ahead, num_warps=NUM_WARPS,
        num_stages=DECODE_STAGES if ahead else NUM_STAGES, enable_fp_fusion=FP_FUSION)
    if parallel_splits:
        _merge_splits_kernel[grid[:2] + (h_kv,)](
            out, pm, pl, pacc, meta.cu_seqlens_q, meta.context_lens, n_split_grid, hq, out.stride(0), out.stride(1),
            G=g, BQ=rows, D=d, SPLIT=SPLIT, num_warps=NUM_WARPS, enable_fp_fusion=FP_FUSION)
