"""samebits.kernels: batch-invariant ops. Triton on CUDA (imported lazily), a fixed-shape CPU path elsewhere.

Every function here is the deterministic implementation; `get_ops(mode, device)` picks between these and the
vendor ops. Unsupported dtype/device raises UnsupportedOpError naming op, dtype, device and shape.
"""
from __future__ import annotations

from samebits.kernels.common import UnsupportedOpError

__all__ = [
    "Ops",
    "UnsupportedOpError",
    "add_rms_norm",
    "det_mean",
    "det_sum",
    "get_ops",
    "linear",
    "log_softmax",
    "matmul",
    "rms_norm",
    "silu_and_mul",
    "softmax",
]


def _cpu():
    from samebits.kernels import cpu

    return cpu


def linear(x, weight, bias=None):
    """x [..., K], weight [N, K], bias [N] or None -> [..., N] in x.dtype."""
    from samebits.kernels.common import check, require

    require("linear", x, weight, bias)
    check(x.shape[-1] == weight.shape[-1] and weight.dim() == 2, "linear",
          f"x {tuple(x.shape)} and weight {tuple(weight.shape)}: need x [..., K], weight [N, K]")
    check(x.dtype == weight.dtype, "linear", f"x is {x.dtype}, weight is {weight.dtype}")
    if x.device.type == "cuda":
        from samebits.kernels import vendor_gemm
        from samebits.kernels.matmul import linear as tri_linear

        x2 = x.reshape(-1, x.shape[-1])
        if vendor_gemm.eligible(x2, weight, bias):
            return vendor_gemm.lt_linear(x2, weight).reshape(*x.shape[:-1], weight.shape[0])
        return tri_linear(x, weight, bias)
    return _cpu().linear(x, weight, bias)


def matmul(a, b):
    """a [M, K] @ b [K, N] -> [M, N] in a.dtype."""
    from samebits.kernels.common import check, require

    require("matmul", a, b)
    check(a.dim() == 2 and b.dim() == 2 and a.shape[1] == b.shape[0], "matmul",
          f"a {tuple(a.shape)} @ b {tuple(b.shape)}: need a [M, K], b [K, N]")
    check(a.dtype == b.dtype, "matmul", f"a is {a.dtype}, b is {b.dtype}")
    if a.device.type == "cuda":
        from samebits.kernels.matmul import matmul as tri_matmul

        return tri_matmul(a, b)
    return _cpu().matmul(a, b)


def rms_norm(x, weight, eps=1e-6):
    """x [..., H], weight [H] -> [..., H] in x.dtype (HF Llama semantics: fp32 normalise, round, scale)."""
    from samebits.kernels.common import check, require

    require("rms_norm", x, weight)
    check(weight.shape == x.shape[-1:], "rms_norm", f"x {tuple(x.shape)}, weight {tuple(weight.shape)}")
    if x.device.type == "cuda":
        from samebits.kernels.rmsnorm import rms_norm as tri

        return tri(x, weight, eps)
    return _cpu().rms_norm(x, weight, eps)


def add_rms_norm(x, residual, weight, eps=1e-6):
    """-> (rms_norm(x + residual), x + residual), the sum rounded to x.dtype."""
    from samebits.kernels.common import check, require

    require("add_rms_norm", x, residual, weight)
    check(x.shape == residual.shape and x.dtype == residual.dtype, "add_rms_norm",
          f"x {tuple(x.shape)} {x.dtype}, residual {tuple(residual.shape)} {residual.dtype}")
    if x.device.type == "cuda":
        from samebits.kernels.rmsnorm import add_rms_norm as tri

        return tri(x, residual, weight, eps)
    return _cpu().add_rms_norm(x, residual, weight, eps)


def softmax(x, dim=-1):
    """fp32 softmax along dim."""
    from samebits.kernels.common import require

    require("softmax", x)
    if x.device.type == "cuda":
        from samebits.kernels.softmax import softmax as tri

        return tri(x, dim)
    return _cpu().softmax(x, dim)


def log_softmax(x, dim=-1):
    """fp32 log_softmax along dim."""
    from samebits.kernels.common import require

    require("log_softmax", x)
    if x.device.type == "cuda":
        from samebits.kernels.softmax import log_softmax as tri

        return tri(x, dim)
    return _cpu().log_softmax(x, dim)


def _sum_rows(x, dim):
    # -> (fp32 [R] sums of rows along dim, output shape, n summed); dim None sums everything.
    if dim is None:
        rows, shape = x.reshape(1, -1), ()
    else:
        xt = x.movedim(dim, -1)
        rows, shape = xt.reshape(-1, xt.shape[-1]), xt.shape[:-1]
    if x.device.type == "cuda":
        from samebits.kernels.reduce import det_sum_rows
    else:
        det_sum_rows = _cpu().det_sum_rows
    return det_sum_rows(rows), shape, rows.shape[1]


def det_sum(x, dim=None):
    """Two-stage deterministic sum (fp32 accumulation) over all elements or one dim; result in x.dtype."""
    from samebits.kernels.common import require

    require("det_sum", x)
    s, shape, _ = _sum_rows(x, dim)
    return s.reshape(shape).to(x.dtype)


def det_mean(x, dim=None):
    """det_sum / n, divided in fp32 before rounding to x.dtype."""
    from samebits.kernels.common import require

    require("det_mean", x)
    s, shape, n = _sum_rows(x, dim)
    return (s / n).reshape(shape).to(x.dtype)


def silu_and_mul(x):
    """x [T, 2I] -> silu(x[:, :I]) * x[:, I:] in x.dtype, computed in fp32 (on CPU spelled with exp: see kernels/cpu)."""
    from samebits.kernels.common import require

    require("silu_and_mul", x)
    if x.device.type != "cuda":
        return _cpu().silu_and_mul(x)
    import torch.nn.functional as F

    i = x.shape[-1] // 2
    xf = x.float()
    return (F.silu(xf[..., :i]) * xf[..., i:]).to(x.dtype)


def __getattr__(name):
    if name in ("get_ops", "Ops"):
        from samebits.kernels import registry

        return getattr(registry, name)
    raise AttributeError(f"module 'samebits.kernels' has no attribute {name!r}")


# The public functions by name: `samebits.kernels.matmul`/`.softmax` become modules once those submodules load.
_PUBLIC = {"matmul": matmul, "softmax": softmax}
