"""The one product form of the Triton kernels: acc + a @ b, on the tensor cores or, under the interpreter, in K order.

numpy's float32 matmul, which the interpreter's tl.dot calls, rounds an element by where it sits in the matrix: the
OpenBLAS kernels it dispatches to (by CPU) treat the edge rows and columns of a block apart, so a row moved from index
0 to 8 of the same product gets other bits. No GPU tile does that (a row's bits are the same at every tile position
and width on the H200: docs/results/mma_roles.h200.json), and the kernels' invariance tests run under the
interpreter on the CPU, so there each element is summed in K order by tl.sum, a function of its own operands alone.
"""
from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mma(a, b, acc, UPCAST: tl.constexpr, PRECISION: tl.constexpr):
    # acc + a @ b (acc may be None). UPCAST (the interpreter): fp32 products of row-major copies of the operands (a
    # flat round trip: numpy sums a transposed view's products pairwise instead) summed over the middle axis in K
    # order, then added to acc.
    if UPCAST:
        a = tl.reshape(tl.reshape(a.to(tl.float32), [a.shape[0] * a.shape[1]]), [a.shape[0], a.shape[1]])
        b = tl.reshape(tl.reshape(b.to(tl.float32), [b.shape[0] * b.shape[1]]), [b.shape[0], b.shape[1]])
        out = tl.sum(a[:, :, None] * b[None, :, :], 1)
        if acc is not None:
            out = acc + out
    else:
        out = tl.dot(a, b, acc, input_precision=PRECISION)
    return out


@triton.jit
def mma_fp8(a, b, UPCAST: tl.constexpr):
    # a @ b of e4m3 tiles from a zero float32 accumulator: one K step of the FP8 GEMM (kernels/triton/fp8.py). On the
    # GPU the e4m3 wgmma, every accumulation of the step in the tensor cores' own precision (max_num_imprecise_acc =
    # the step's K: no float32 promotion inside a step, whatever Triton's default); UPCAST (the interpreter): the
    # exact e4m3 values as float32, summed in K order as `mma` does.
    if UPCAST:
        out = mma(a.to(tl.float32), b.to(tl.float32), None, True, "ieee")
    else:
        out = tl.dot(a, b, out_dtype=tl.float32, max_num_imprecise_acc=a.shape[1])
    return out
