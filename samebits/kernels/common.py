"""Shared guards of the deterministic backends (fail loud, never fall back) and small helpers of the kernels."""
from __future__ import annotations

import itertools
import os
from array import array

import torch

DET_DTYPES = (torch.bfloat16, torch.float16, torch.float32)
DET_DEVICES = ("cpu", "cuda")


class UnsupportedOpError(RuntimeError):
    """Deterministic mode has no batch-invariant implementation for this op/dtype/device/shape."""


def unsupported(op: str, x, why: str = "") -> UnsupportedOpError:
    dtype = getattr(x, "dtype", None)
    device = getattr(x, "device", None)
    shape = tuple(x.shape) if hasattr(x, "shape") else None
    msg = (f"samebits deterministic {op}: no batch-invariant implementation for dtype={dtype}, "
           f"device={device}, shape={shape}")
    return UnsupportedOpError(msg + (f" ({why})" if why else "") + "; refusing to fall back to a vendor kernel")


def require(op: str, *tensors, dtypes=DET_DTYPES) -> None:
    """Raise unless every tensor has a dtype and device that deterministic mode implements."""
    for t in tensors:
        if t is None:
            continue
        if t.device.type not in DET_DEVICES:
            raise unsupported(op, t, "device")
        if t.dtype not in dtypes:
            raise unsupported(op, t, "dtype")


def check(cond: bool, op: str, msg: str) -> None:
    if not cond:
        raise ValueError(f"samebits {op}: {msg}")


def check_linear(x, weight, bias) -> None:
    require("linear", x, weight, bias)
    check(x.shape[-1] == weight.shape[-1] and weight.dim() == 2, "linear",
          f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need x [..., K], weight [N, K]")
    check(x.dtype == weight.dtype, "linear", f"x is {x.dtype}, weight is {weight.dtype}")


def check_linear_partials(x, weights) -> None:
    require("linear_partials", x, weights)
    check(weights.dim() == 3 and x.dim() == 2 and x.shape[1] == weights.shape[0] * weights.shape[2],
          "linear_partials", f"x {tuple(x.shape)} and weights {tuple(weights.shape)}: need x [M, C*Kc], "
          "weights [C, N, Kc]")
    check(x.dtype == weights.dtype, "linear_partials", f"x is {x.dtype}, weights are {weights.dtype}")


def check_matmul(a, b) -> None:
    require("matmul", a, b)
    check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul",
          f"a {tuple(a.shape)} @ b {tuple(b.shape)}: need a [M, K], b [K, N]")
    check(a.dtype == b.dtype, "matmul", f"a is {a.dtype}, b is {b.dtype}")


def check_rms_norm(x, weight) -> None:
    require("rms_norm", x, weight)
    check(weight.shape == x.shape[-1:], "rms_norm", f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")


def check_add_rms_norm(x, residual, weight) -> None:
    require("add_rms_norm", x, residual, weight)
    check(x.shape == residual.shape and x.dtype == residual.dtype, "add_rms_norm",
          f"x {tuple(x.shape)} {x.dtype}, residual {tuple(residual.shape)} {residual.dtype}")


def per_entry(matmul, a, b):
    """a [B, M, K] @ b [B, K, N] -> [B, M, N] as one `matmul` per batch entry, so an entry never sees its batch."""
    out = a.new_empty(a.shape[0], a.shape[1], b.shape[2])
    for i in range(a.shape[0]):
        out[i] = matmul(a[i], b[i])
    return out


# Integer lists cross through an array of the same C type: torch.tensor checks every element's Python type, which
# cost twice as much for a decode step's 256 x 44 input rows (benchmarks/host_step.py).
_ARRAY_TYPES = {torch.int64: "q", torch.int32: "i"}


def to_device(values, dtype: torch.dtype, device) -> torch.Tensor:
    """A host list (or a list of equal-length rows) as a tensor on `device` without a host sync: on CUDA staged in
    pinned memory and copied non_blocking, so building a step's inputs never waits for the GPU to finish the previous
    launch (the caching host allocator keeps the staging buffer until the copy has run)."""
    device = torch.device(device) if device is not None else torch.device("cpu")
    host = _host_ints(values, dtype) if dtype in _ARRAY_TYPES else None
    if host is None:
        if device.type != "cuda":
            return torch.tensor(values, dtype=dtype, device=device)
        return torch.tensor(values, dtype=dtype, pin_memory=True).to(device, non_blocking=True)
    if device.type != "cuda":
        return host.to(device)
    return torch.empty(host.shape, dtype=dtype, pin_memory=True).copy_(host).to(device, non_blocking=True)


def _host_ints(values, dtype: torch.dtype) -> torch.Tensor | None:
    """A flat list or a list of equal rows of ints as a CPU tensor over an array's buffer; None for any other
    shape (torch.tensor then builds it, or says what is wrong with it)."""
    if not isinstance(values, list) or not values:
        return None
    rows = isinstance(values[0], list)
    width = len(values[0]) if rows else 0
    if rows and (not width or any(len(row) != width for row in values)):
        return None
    try:  # a float among the ints: torch.tensor's path, which truncates it as before
        flat = array(_ARRAY_TYPES[dtype], itertools.chain.from_iterable(values) if rows else values)
    except TypeError:
        return None
    host = torch.frombuffer(flat, dtype=dtype)  # keeps `flat` alive
    return host.view(len(values), width) if rows else host


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())
