"""FP8 (e4m3) linears on the tensor cores: per-token activation quantisation and the W8A8 GEMM (references:
kernels/fp8.py; the recipe's numbers: kernels/configs.py "fp8", the tiles "matmul_fp8").

`_quantize_rows_kernel`: one row per program, its max over K (exact in any order), its power-of-two scale, its e4m3
values; a row's bits are a function of the row. `_fp8_matmul_kernel`: K in steps of K_STEP in sequence, each step one
tl.dot of e4m3 operands from a zero float32 accumulator, added to the sum in K order; scales applied in a fixed order
(block scales per step, channel scales once at the end). The tile follows M, the order never. At M <= 4 the GEMM
quantises its own rows (FUSED, the same arithmetic as the quantisation kernel) and saves a decode step one launch per
linear.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels import fp8 as ref
from samebits.kernels.common import interpreting
from samebits.kernels.configs import LAUNCH, TILE_CONFIGS
from samebits.kernels.triton.matmul import grouped_tile, pipeline_stages
from samebits.kernels.triton.mma import mma_fp8

# How a kernel's activations are scaled (the recipe's "token", "group", "static"), as constexpr codes.
TOKEN, GROUP, STATIC = tl.constexpr(0), tl.constexpr(1), tl.constexpr(2)
_ACT = {"token": TOKEN.value, "group": GROUP.value, "static": STATIC.value}
_QUANT = TILE_CONFIGS["fp8_quant"]["config"]
_FP8_MAX = tl.constexpr(ref.FP8_MAX)
_MIN_EXP = tl.constexpr(ref.MIN_SCALE_EXP)


@triton.jit
def _scale_exp(amax):
    # int32 e, the least with amax <= 448 * 2^e, at least _MIN_EXP (kernels/fp8.py scale_exponent): from the bits.
    bits = amax.to(tl.int32, bitcast=True)
    e = ((bits >> 23) & 0xFF) - 135 + ((bits & 0x7FFFFF) > 0x600000).to(tl.int32)
    return tl.maximum(e, _MIN_EXP)


@triton.jit
def _pow2(e):
    return ((e + 127) << 23).to(tl.float32, bitcast=True)


@triton.jit
def _to_fp8(y):
    # Clamp, then the nearest e4m3 value, ties to even, as integer arithmetic on the float32 bits (the interpreter's
    # float32 -> e4m3 cast does not carry a rounding into the exponent): normal values keep 3 mantissa bits; below
    # 2^-6 the step is 2^-9, rounded by the 1.5 * 2^23 trick (exact float32 adds). The sign is put back from the bits,
    # so -0 and tiny negatives stay negative, as torch's cast keeps them. The value is then exact in e4m3.
    y = tl.minimum(tl.maximum(y, -_FP8_MAX), _FP8_MAX)
    bits = y.to(tl.int32, bitcast=True)
    sign = (bits >> 31) << 31
    mag = bits & 0x7FFFFFFF
    normal = (mag + 0x7FFFF + ((mag >> 20) & 1)) & -0x100000
    a = mag.to(tl.float32, bitcast=True)
    sub = (((a * 512.0 + 12582912.0) - 12582912.0) * 0.001953125).to(tl.int32, bitcast=True)
    rounded = (tl.where(a < 0.015625, sub, normal) | sign).to(tl.float32, bitcast=True)
    return rounded.to(tl.float8e4nv, fp_downcast_rounding="rtne")


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, s_ptr, in_ptr, K, stride_x, stride_q, stride_s,
                          ACT: tl.constexpr, BLOCK: tl.constexpr, STEP: tl.constexpr):
    # grid (M,): x [M, K] -> q [M, K] e4m3 and s: [M] (TOKEN), [M, cdiv(K, STEP)] (GROUP), nothing (STATIC: the
    # checkpoint's scale at in_ptr).
    row = tl.program_id(0).to(tl.int64)
    x_row = x_ptr + row * stride_x
    q_row = q_ptr + row * stride_q
    if ACT == GROUP:
        offs = tl.arange(0, STEP)
        for g in range(tl.cdiv(K, STEP)):
            cols = g * STEP + offs
            x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
            e = _scale_exp(tl.max(tl.abs(x), 0))
            tl.store(q_row + cols, _to_fp8(x * _pow2(-e)), mask=cols < K)
            tl.store(s_ptr + row * stride_s + g, _pow2(e))
    else:
        offs = tl.arange(0, BLOCK)
        if ACT == STATIC:
            s_in = tl.load(in_ptr)
        else:
            amax = 0.0
            for start in range(0, K, BLOCK):
                x = tl.load(x_row + start + offs, mask=start + offs < K, other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.max(tl.abs(x), 0))
            e = _scale_exp(amax)
            inv = _pow2(-e)
            tl.store(s_ptr + row * stride_s, _pow2(e))
        for start in range(0, K, BLOCK):
            cols = start + offs
            x = tl.load(x_row + cols, mask=cols < K, other=0.0).to(tl.float32)
            if ACT == STATIC:
                y = tl.math.div_rn(x, s_in)
            else:
                y = x * inv
            tl.store(q_row + cols, _to_fp8(y), mask=cols < K)


@triton.jit
def _fp8_matmul_kernel(a_ptr, as_ptr, w_ptr, ws_ptr, c_ptr, bias_ptr, M, N, K,
                       stride_am, stride_as, stride_wn, stride_ws, stride_cm,
                       ACT: tl.constexpr, FUSED: tl.constexpr, BLOCK_W: tl.constexpr, W_ROWS: tl.constexpr,
                       HAS_BIAS: tl.constexpr, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr,
                       GROUP_M: tl.constexpr, EVEN_K: tl.constexpr, UPCAST: tl.constexpr):
    # a [M, K]: e4m3 with scales at as_ptr, or (FUSED) the unquantised rows; w [N, K] e4m3 with scales at ws_ptr
    # ([N], or [cdiv(N, W_ROWS), cdiv(K, BK)] with BLOCK_W); c [M, N]. One program owns one [BM, BN] tile of c.
    pid_m, pid_n = grouped_tile(tl.program_id(0), M, N, BM, BN, GROUP_M)
    rm = pid_m * BM + tl.arange(0, BM)
    rn = pid_n * BN + tl.arange(0, BN)
    rk = tl.arange(0, BK)
    rows = rm < M  # rows past M are masked, not wrapped: a decode tile's idle rows read nothing
    rwn = rn % N
    a_ptrs = a_ptr + rm.to(tl.int64)[:, None] * stride_am + rk[None, :]
    w_ptrs = w_ptr + rwn.to(tl.int64)[None, :] * stride_wn + rk[:, None]
    if FUSED:
        if ACT == TOKEN:  # the rows' max over K first: the quantisation kernel's scales, computed here
            amax = tl.zeros((BM,), dtype=tl.float32)
            p = a_ptrs
            for kb in range(tl.cdiv(K, BK)):
                x = tl.load(p, mask=rows[:, None] & (rk[None, :] < K - kb * BK), other=0.0).to(tl.float32)
                amax = tl.maximum(amax, tl.max(tl.abs(x), 1))
                p += BK
            e = _scale_exp(amax)
            a_inv = _pow2(-e)
            a_scale = _pow2(e)
        if ACT == STATIC:
            s_in = tl.load(as_ptr)
    acc = tl.zeros((BM, BN), dtype=tl.float32)
    for kb in range(tl.cdiv(K, BK)):
        if EVEN_K:
            a = tl.load(a_ptrs, mask=rows[:, None], other=0.0)
            w = tl.load(w_ptrs)
        else:  # the K tail is zero-filled: exact zeros in the step's sum
            k_in = rk < K - kb * BK
            a = tl.load(a_ptrs, mask=rows[:, None] & k_in[None, :], other=0.0)
            w = tl.load(w_ptrs, mask=k_in[:, None], other=0.0)
        if FUSED:
            af = a.to(tl.float32)
            if ACT == TOKEN:
                a = _to_fp8(af * a_inv[:, None])
            elif ACT == GROUP:
                e = _scale_exp(tl.max(tl.abs(af), 1))
                a = _to_fp8(af * _pow2(-e)[:, None])
                g_scale = _pow2(e)
            else:
                a = _to_fp8(tl.math.div_rn(af, s_in))
        step = mma_fp8(a, w, UPCAST)
        if BLOCK_W:
            if not FUSED:
                g_scale = tl.load(as_ptr + rm * stride_as + kb, mask=rows, other=1.0)
            w_scale = tl.load(ws_ptr + (rwn // W_ROWS) * stride_ws + kb)
            acc += step * g_scale[:, None] * w_scale[None, :]
        else:
            acc += step
        a_ptrs += BK
        w_ptrs += BK
    if not BLOCK_W:
        if ACT == TOKEN:
            if not FUSED:
                a_scale = tl.load(as_ptr + rm * stride_as, mask=rows, other=1.0)
            acc = acc * a_scale[:, None]
        acc = acc * tl.load(ws_ptr + rwn)[None, :]
    if HAS_BIAS:
        acc += tl.load(bias_ptr + rwn).to(tl.float32)[None, :]
    c_ptrs = c_ptr + rm.to(tl.int64)[:, None] * stride_cm + rn[None, :]
    tl.store(c_ptrs, acc.to(c_ptr.dtype.element_ty), mask=rows[:, None] & (rn[None, :] < N))


def tile_for(m: int, table=None) -> list:
    """The [max_M, BM, BN, BK, warps, stages, GROUP_M, FUSED] row of the FP8 table that serves M rows."""
    for row in table or TILE_CONFIGS["matmul_fp8"]["config"]:
        if m <= row[0]:
            return row
    raise AssertionError("the FP8 matmul table's last row must cover every M")


def quantize(x2d: torch.Tensor, recipe: ref.Fp8Recipe, input_scale: torch.Tensor | None = None):
    """x [M, K] -> (q [M, K] e4m3, scales or None): `kernels.fp8.quantize_activations`'s bits, one row a program."""
    assert x2d.dim() == 2 and x2d.dtype in ref.IN_DTYPES, f"quantize: x {tuple(x2d.shape)} {x2d.dtype}"
    assert recipe.activations in _ACT, f"quantize: activations={recipe.activations!r} is not per row"
    x2d = x2d if x2d.stride(-1) == 1 else x2d.contiguous()
    m, k = x2d.shape
    act = _ACT[recipe.activations]
    q = torch.empty(m, k, dtype=ref.FP8, device=x2d.device)
    # Static activations write no scale; their buffer is one element (a pointer to no memory is refused at launch).
    shape = {TOKEN.value: (m,), GROUP.value: (m, triton.cdiv(k, ref.K_STEP)), STATIC.value: (1,)}[act]
    scales = torch.empty(shape, dtype=torch.float32, device=x2d.device)
    if m and k:
        _quantize_rows_kernel[(m,)](x2d, q, scales, input_scale if input_scale is not None else scales, k,
                                    x2d.stride(0), q.stride(0), scales.stride(0) if scales.dim() else 0,
                                    ACT=act, BLOCK=_QUANT["block"], STEP=ref.K_STEP, num_warps=_QUANT["num_warps"],
                                    **LAUNCH)
    elif act != STATIC.value:
        scales.fill_(2.0 ** ref.MIN_SCALE_EXP)  # an empty row's max is 0
    return q, (None if act == STATIC.value else scales)


def gemm(a, a_scale, weight, scale, recipe: ref.Fp8Recipe, bias=None, out_dtype=torch.bfloat16, config=None,
         fused: bool = False):
    """a [M, K] (e4m3 with `a_scale`, or with `fused` the unquantised rows, `a_scale` then the static input scale or
    None) @ weight[N, K]^T -> [M, N] in out_dtype; `scale` is the weight's (folded with the input scale for static
    activations)."""
    m, k = a.shape
    n = weight.shape[0]
    assert weight.dim() == 2 and weight.shape[1] == k and weight.dtype == ref.FP8, \
        f"fp8 gemm: a {tuple(a.shape)}, weight {weight.dtype} {tuple(weight.shape)}"
    assert fused or a.dtype == ref.FP8, f"fp8 gemm: a is {a.dtype}; quantise it first or pass fused=True"
    assert a.stride(1) == 1 and weight.stride(1) == 1, "fp8 gemm: a and weight need a contiguous K"
    act = _ACT["token" if recipe.activations == "tensor" else recipe.activations]
    c = torch.empty(m, n, device=a.device, dtype=out_dtype)
    if m == 0 or n == 0:
        return c
    _, bm, bn, bk, warps, stages, group_m, _ = config or tile_for(m)
    assert bk == ref.K_STEP and bm >= 64, f"fp8 gemm: BK must be the k_step {ref.K_STEP}, BM >= 64 (got {bm}, {bk})"
    stages = pipeline_stages(bm, bn, bk, stages, a.element_size())
    block_w = recipe.weights == "block"
    a_scale = a_scale if a_scale is not None else scale
    grid = (triton.cdiv(m, bm) * triton.cdiv(n, bn),)
    _fp8_matmul_kernel[grid](
        a, a_scale, weight, scale, c, bias if bias is not None else c, m, n, k,
        a.stride(0), a_scale.stride(0) if a_scale.dim() else 0, weight.stride(0),
        scale.stride(0) if block_w else 1, c.stride(0),
        ACT=act, FUSED=fused, BLOCK_W=block_w, W_ROWS=recipe.block[0] if block_w else 1, HAS_BIAS=bias is not None,
        BM=bm, BN=bn, BK=bk, GROUP_M=group_m, EVEN_K=k % bk == 0, UPCAST=interpreting(),
        num_warps=warps, num_stages=stages, **LAUNCH,
    )
    return c


def linear_fp8(x, weight, scale, recipe: ref.Fp8Recipe, input_scale=None, bias=None, config=None):
    """x [..., K] -> [..., N] in x.dtype (Ops.linear_fp8, docs/CONTRACTS.md): the rows quantised by the recipe, then
    the GEMM; one launch where the table row is FUSED. "tensor" activations (fast mode only) are quantised by the
    torch reference, since their scale is the batch's."""
    x2 = x.reshape(-1, x.shape[-1])
    x2 = x2 if x2.stride(-1) == 1 else x2.contiguous()
    row = config or tile_for(x2.shape[0])
    if row[7] and recipe.activations != "tensor":
        y = gemm(x2, input_scale, weight, scale, recipe, bias, x.dtype, row, fused=True)
    elif recipe.activations == "tensor":
        q, a_scale = ref.quantize_activations(x2, recipe)
        y = gemm(q, a_scale, weight, scale, recipe, bias, x.dtype, row)
    else:
        q, a_scale = quantize(x2, recipe, input_scale)
        y = gemm(q, a_scale, weight, scale, recipe, bias, x.dtype, row)
    return y.reshape(*x.shape[:-1], weight.shape[0])
