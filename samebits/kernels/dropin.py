"""`samebits.batch_invariant()`: route any PyTorch model's matmuls, softmaxes, means, sums and RMSNorms through
samebits' batch-invariant kernels by overriding their aten CPU and CUDA kernels with torch.library.

The override is process-wide (every thread) while at least one `with` block is open. Nested blocks share the
outermost registration; only the outermost exit removes it, and removal restores whatever kernel was registered
before (torch keeps earlier registrations stacked beneath ours). Exceptions inside the block still remove it.
"""
from __future__ import annotations

import math
import threading
import warnings
from contextlib import contextmanager

import torch

import samebits.kernels as K
from samebits.kernels.common import DET_DTYPES, unsupported
from samebits.kernels.cpu.backend import silu as cpu_silu

_lock = threading.Lock()
_state = {"depth": 0, "lib": None}
_EXACT = (torch.bool, torch.uint8, torch.int8, torch.int16, torch.int32, torch.int64)
_DISPATCH_KEYS = ("CPU", "CUDA")


def _float_only(op, *tensors):
    for t in tensors:
        if t.dtype not in DET_DTYPES:
            raise unsupported(f"batch_invariant aten::{op}", t, "dtype")


def _mm(a, b):
    if a.dtype in _EXACT and b.dtype in _EXACT:
        # Integer products and sums are exact: any order gives the same bits (aten::mm.out is not overridden).
        return torch.mm(a, b, out=a.new_empty(a.shape[0], b.shape[1]))
    _float_only("mm", a, b)
    return K.matmul(a, b)


def _addmm(bias, a, b, beta=1, alpha=1):
    _float_only("addmm", bias, a, b)
    if beta == 1 and alpha == 1 and bias.dim() == 1 and bias.dtype == a.dtype:
        return K.linear(a, b.t(), bias)  # bias added in fp32 before the one rounding, as cuBLAS's epilogue does
    out = K.matmul(a, b).float() * alpha + bias.float() * beta
    return out.to(a.dtype)


def _bmm(a, b):
    _float_only("bmm", a, b)
    return K.get_ops("deterministic", a.device).bmm(a, b)


def _silu(x):
    # CPU only: torch's CPU silu gives a vector tail other bits than the vector body (see kernels/cpu/backend.py).
    _float_only("silu", x)
    return cpu_silu(x)


def _softmax(x, dim, half_to_float):
    _float_only("_softmax", x)
    y = K.softmax(x, dim)
    return y if half_to_float else y.to(x.dtype)


def _log_softmax(x, dim, half_to_float):
    _float_only("_log_softmax", x)
    y = K.log_softmax(x, dim)
    return y if half_to_float else y.to(x.dtype)


def _det_reduce(op, x, dim, keepdim, dtype, mean):
    if x.dtype in _EXACT and not mean:
        out_dtype = dtype or torch.int64
        return torch.sum(x, dim, keepdim, dtype=out_dtype, out=x.new_empty(0, dtype=out_dtype))
    _float_only(op, x)
    out_dtype = dtype or x.dtype
    if out_dtype not in DET_DTYPES:
        raise unsupported(f"batch_invariant aten::{op} (dtype={out_dtype})", x, "output dtype")
    # An empty dim list means every dim, as in aten.
    dims = sorted(d % max(x.dim(), 1) for d in (dim if dim else range(x.dim())))
    kept = [d for d in range(x.dim()) if d not in dims]
    xt = x.permute(*kept, *dims) if x.dim() else x.reshape(1)
    rows = xt.reshape(-1, math.prod(x.shape[d] for d in dims))
    s = K.det_mean(rows, dim=-1) if mean else K.det_sum(rows, dim=-1)
    s = s.to(out_dtype).reshape([x.shape[d] for d in kept])
    for d in dims if keepdim else []:
        s = s.unsqueeze(d)
    return s


def _sum(x, dim, keepdim=False, dtype=None):
    return _det_reduce("sum.dim_IntList", x, dim, keepdim, dtype, mean=False)


def _mean(x, dim, keepdim=False, dtype=None):
    return _det_reduce("mean.dim", x, dim, keepdim, dtype, mean=True)


def _rms_norm(x, normalized_shape, weight=None, eps=None):
    _float_only("rms_norm", x)
    n = len(normalized_shape)
    eps = torch.finfo(x.dtype).eps if eps is None else eps
    rows = x.reshape(*x.shape[: x.dim() - n], -1)
    w = weight.reshape(-1) if weight is not None else torch.ones(rows.shape[-1], dtype=x.dtype, device=x.device)
    return K.rms_norm(rows, w.to(x.dtype), eps).reshape(x.shape)


OVERRIDES = {
    "mm": _mm,
    "addmm": _addmm,
    "bmm": _bmm,
    "_softmax": _softmax,
    "_log_softmax": _log_softmax,
    "mean.dim": _mean,
    "sum.dim_IntList": _sum,
    "rms_norm": _rms_norm,
    "silu": _silu,
}
# Overrides that only the CPU needs; the rest are registered for every key in _DISPATCH_KEYS.
_CPU_ONLY = {"silu"}


def _register():
    lib = torch.library.Library("aten", "IMPL")
    try:
        with warnings.catch_warnings():
            # torch warns that we override an existing kernel: that is the point.
            warnings.simplefilter("ignore")
            for name, fn in OVERRIDES.items():
                if not _op_exists(name):  # rms_norm only exists in newer torch
                    continue
                for key in ("CPU",) if name in _CPU_ONLY else _DISPATCH_KEYS:
                    lib.impl(name, fn, key)
    except Exception:
        lib._destroy()
        raise
    return lib


def _op_exists(name):
    base, _, overload = name.partition(".")
    packet = getattr(torch.ops.aten, base, None)
    return packet is not None and (not overload or overload in packet.overloads())


@contextmanager
def batch_invariant():
    """Inside the block, the overridden aten ops are batch-invariant on CPU and CUDA, or raise naming the op."""
    with _lock:
        if _state["depth"] == 0:
            _state["lib"] = _register()
        _state["depth"] += 1
    try:
        yield
    finally:
        with _lock:
            _state["depth"] -= 1
            if _state["depth"] == 0:
                lib, _state["lib"] = _state["lib"], None
                lib._destroy()


def active() -> bool:
    return _state["depth"] > 0
