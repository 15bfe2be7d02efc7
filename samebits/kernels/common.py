"""Shared guards and helpers of the deterministic kernels: fail-loud checks, shape arithmetic, lazy triton."""
from __future__ import annotations

import os

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


def interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") == "1"


def triton_path(x) -> bool:
    """CUDA tensors go to Triton; CPU tensors go to the CPU path (Triton's interpreter is for tests only)."""
    return x.device.type == "cuda"


def next_pow2(n: int) -> int:
    return 1 << max(0, (int(n) - 1).bit_length())


def cdiv(a: int, b: int) -> int:
    return -(-a // b)


def callable_as_public(module_name: str, fn_name: str) -> None:
    """Make module `samebits.kernels.<fn_name>` callable as the public function of the same name.

    Importing a submodule rebinds the package attribute of that name to the module, so after
    `import samebits.kernels.matmul` the name `samebits.kernels.matmul` is the module: calling it must still work.
    """
    import sys
    import types

    class _PublicModule(types.ModuleType):
        def __call__(self, *args, **kwargs):
            return sys.modules["samebits.kernels"]._PUBLIC[fn_name](*args, **kwargs)

    sys.modules[module_name].__class__ = _PublicModule
