"""The batch-invariant CPU path: every vendor call is made at one fixed shape, so a row's bits never see M.

torch's CPU kernels pick blocking and threading from the whole shape. Calling them only on fixed-shape blocks
([rows, K] padded with zeros) makes the reduction order a function of K, N and constants. Ops that aten dispatch
may route back to samebits (drop-in mode) are called through their out= overloads, which drop-in leaves alone.
bf16/fp16 are computed in fp32 and rounded once at the end.
"""
from __future__ import annotations

import torch

from samebits.kernels.common import cdiv, in_row_blocks
from samebits.kernels.configs import TILE_CONFIGS

_MM = TILE_CONFIGS["cpu_matmul"]["config"]
_ROWS = TILE_CONFIGS["cpu_rows"]["config"]["block_rows"]
_SUM = TILE_CONFIGS["det_sum"]["config"]


def _pad_rows(x, rows):
    # [..., M, K] -> fp32 [..., blocks * rows, K], zero rows appended.
    m = x.shape[-2]
    out = x.new_zeros(*x.shape[:-2], cdiv(max(m, 1), rows) * rows, x.shape[-1], dtype=torch.float32)
    out[..., :m, :] = x
    return out


def _pad_cols(b, n_min):
    # [..., K, N] -> fp32 [..., K, max(N, n_min)], zero columns appended (MKL's small-N path is position-dependent).
    n = b.shape[-1]
    if n >= n_min:
        return b.float()
    out = b.new_zeros(*b.shape[:-1], n_min, dtype=torch.float32)
    out[..., :n] = b
    return out


def _block_mm(a_blocks, b_blocks):
    """[nb, rows, K] @ [nb, K, N] -> [nb, rows, N] in one aten::bmm.out call (drop-in mode leaves .out alone).

    Each block is one fixed-shape gemm, computed alone whatever nb is (guarded by tests); one call instead of
    one per block keeps threading efficient. b_blocks may be a stride-0 expand of one matrix.
    """
    out = a_blocks.new_empty(a_blocks.shape[0], a_blocks.shape[1], b_blocks.shape[2])
    return torch.bmm(a_blocks, b_blocks, out=out)


def block_rows(m: int, table=None) -> int:
    """Rows per fixed-shape block for M rows (every size in the table gives a row the same bits)."""
    return next(rows for max_m, rows in (table or _MM["block_rows"]) if m <= max_m)


def matmul(a, b):
    """a [M, K] @ b [K, N] -> [M, N] in a.dtype, fp32 accumulation, bits independent of M."""
    m, k = a.shape
    rows = block_rows(m)
    ap = _pad_rows(a, rows)
    nb = ap.shape[0] // rows
    bp = _pad_cols(b, _MM["min_n"])
    out = _block_mm(ap.view(nb, rows, k), bp[None].expand(nb, k, bp.shape[1]))
    return out.view(nb * rows, -1)[:m, :b.shape[1]].to(a.dtype)


def bmm(a, b):
    """a [B, M, K] @ b [B, K, N] -> [B, M, N]: every entry cut into the same fixed [rows, K] blocks."""
    nb, m, k = a.shape
    rows = block_rows(m)
    ap = _pad_rows(a, rows)
    blocks = ap.shape[1] // rows
    bp = _pad_cols(b, _MM["min_n"])
    n_pad = bp.shape[2]
    bp = bp[:, None].expand(nb, blocks, k, n_pad).reshape(nb * blocks, k, n_pad)
    out = _block_mm(ap.view(nb * blocks, rows, k), bp)
    return out.view(nb, blocks * rows, n_pad)[:, :m, :b.shape[2]].to(a.dtype)


def linear(x, weight, bias=None):
    """x [..., K], weight [N, K] (F.linear layout) -> [..., N]."""
    k = x.shape[-1]
    y = matmul(x.reshape(-1, k), weight.t())
    if bias is not None:
        y = (y.float() + bias.float()).to(x.dtype) if x.dtype != torch.float32 else y + bias
    return y.reshape(*x.shape[:-1], weight.shape[0])


def _row_sum(x):
    # x [rows, N] fp32 -> [rows]; aten::sum.IntList_out at a fixed shape.
    out = x.new_empty(x.shape[0])
    return torch.sum(x, dim=-1, out=out)


def _rms_block(x, w, eps, dtype):
    # x [rows, H] fp32 -> [rows, H] in dtype, HF Llama semantics: normalise in fp32, round, then scale by w.
    var = _row_sum(x * x) / x.shape[-1]
    y = (x * torch.rsqrt(var + eps)[:, None]).to(dtype)
    return y * w


def rms_norm(x, weight, eps):
    h = x.shape[-1]
    w = weight.to(x.dtype)
    rows = x.reshape(-1, h).float()
    y = in_row_blocks(lambda blk: _rms_block(blk, w, eps, x.dtype), block_rows(len(rows), _ROWS), rows)
    return y.reshape(x.shape)


def add_rms_norm(x, residual, weight, eps):
    """-> (rms_norm(x + residual), x + residual); the sum is rounded to x.dtype first, as an unfused model does."""
    s = x + residual
    return rms_norm(s, weight, eps), s


def _softmax_block(x, log: bool):
    # x [rows, N] fp32 -> [rows, N] fp32; max is exact in any order, the sum goes through _row_sum.
    m = x.amax(dim=-1, keepdim=True)
    e = torch.exp(x - m)
    s = _row_sum(e)[:, None]
    return x - m - torch.log(s) if log else e / s


def _last_dim_rows(x, dim):
    xt = x.movedim(dim, -1)
    return xt, xt.reshape(-1, xt.shape[-1]).float()


def softmax(x, dim=-1, log=False):
    """fp32 softmax (or log_softmax) along dim."""
    if x.numel() == 0:
        return x.float()
    xt, rows = _last_dim_rows(x, dim)
    y = in_row_blocks(lambda blk: _softmax_block(blk, log), block_rows(len(rows), _ROWS), rows)
    return y.reshape(xt.shape).movedim(-1, dim)


def log_softmax(x, dim=-1):
    return softmax(x, dim, log=True)


def segment_len(n: int) -> int:
    """Segment length of the two-stage sum: n cut into SPLIT equal segments (the last ones padded with zeros)."""
    return max(1, cdiv(n, _SUM["split"]))


def det_sum_rows(x):
    """x [R, n] -> [R] fp32: SPLIT fixed segments each summed, then merged in index order 0..SPLIT-1."""
    r, n = x.shape
    split, seg = _SUM["split"], segment_len(n)
    buf = x.new_zeros(r, split * seg, dtype=torch.float32)
    buf[:, :n] = x
    parts = buf.new_empty(r, split)
    # Stage 1: R*SPLIT outputs (>= 2), so torch never splits a segment across threads.
    torch.sum(buf.view(r, split, seg), dim=-1, out=parts)
    acc = parts[:, 0].clone()
    for j in range(1, split):
        acc += parts[:, j]
    return acc
