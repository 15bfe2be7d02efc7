"""The backwards of the ops the RL trainer differentiates (rl/train_ops.py), one backend per device as kernels/ops.py
picks the forwards: Triton kernels on CUDA (kernels/triton/grads.py), the torch forms below on the CPU. The torch forms
are also the references the Triton kernels are tested against (tests/kernels/triton/test_grads.py).

Every sum over the packed tokens has an order written here or in the kernels (configs.py, train.backward): on the
CPU a linear's weight gradient is cut into fixed chunks of tokens, one proven GEMM each (cpu/gemm.py), added in chunk
order; norm and bias weight gradients take the halving tree over the tokens (cpu/reduce.py); row reductions take it
over the row. So a gradient's bits are a function of the packed batch alone, run after run.

Gradients follow autograd through the forward's math, with each rounding of the forward (a normalised row rounded
to the model dtype, say) taken as the identity, as autograd takes a cast; they are computed in fp32 and rounded once
to the input dtype.
"""
from __future__ import annotations

import functools
import importlib
import itertools

import torch

from samebits.kernels.configs import TILE_CONFIGS
from samebits.kernels.cpu.reduce import tree_sum

_CFG = TILE_CONFIGS["train.backward"]["config"]
BACKENDS = {"cpu": "samebits.kernels.grads", "cuda": "samebits.kernels.triton.grads"}
GRADS = ("linear_dx", "linear_dw", "bias_grad", "rms_norm_bwd", "silu_and_mul_bwd", "attention_bwd")


@functools.cache
def _backend(device_type: str):
    if device_type not in BACKENDS:
        raise ValueError(f"samebits grads: no backward backend for device {device_type!r} (have {sorted(BACKENDS)})")
    return importlib.import_module(BACKENDS[device_type])


def get_grads(device):
    """The backward ops of `device`'s type: a module defining every name of GRADS."""
    return _backend(torch.device(device).type)


def _gemm(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """a [M, K] @ b [N, K]^T in fp32: the proven CPU route there (cpu/gemm.py), plain fp32 torch elsewhere (a
    reference on another device's tensors)."""
    if a.device.type == "cpu":
        from samebits.kernels.cpu.gemm import blocked_gemm

        return blocked_gemm(a, b)[:, :b.shape[0]]
    return a.float() @ b.float().t()


def linear_dx(dy: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """dy [..., N], weight [N, K] -> dx [..., K] = dy @ weight, in dy.dtype."""
    dx = _gemm(dy.reshape(-1, dy.shape[-1]), weight.t())
    return dx.to(dy.dtype).reshape(*dy.shape[:-1], weight.shape[1])


def linear_dw(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """dy [..., N], x [..., K] -> dW [N, K] = sum over tokens of dy^T x, in x.dtype: chunks of cpu_tokens tokens (the
    last zero-padded: adding zero products leaves a sum as it was), one GEMM each, added in chunk order."""
    dy2, x2 = dy.reshape(-1, dy.shape[-1]), x.reshape(-1, x.shape[-1])
    step = _CFG["cpu_tokens"]
    total = None
    for t0 in range(0, dy2.shape[0], step):
        a, b = _padded(dy2[t0:t0 + step], step).t(), _padded(x2[t0:t0 + step], step).t()
        part = _gemm(a.contiguous(), b.contiguous())
        total = part if total is None else total + part
    if total is None:
        return x.new_zeros(dy.shape[-1], x.shape[-1])
    return total.to(x.dtype)


def _padded(rows: torch.Tensor, n: int) -> torch.Tensor:
    if rows.shape[0] == n:
        return rows
    out = rows.new_zeros(n, rows.shape[1])
    out[:rows.shape[0]] = rows
    return out


def bias_grad(dy: torch.Tensor) -> torch.Tensor:
    """dy [..., N] -> [N], the sum over tokens in the tree order, in dy.dtype."""
    return tree_sum(dy.reshape(-1, dy.shape[-1]).float(), dim=0).to(dy.dtype)


def rms_norm_bwd(dy, x, weight, eps: float, dsum=None):
    """Gradients of y = weight * round(x * rstd(x)) (HF Llama's RMSNorm, the engine's `rms_norm`) -> (dx, dweight),
    x [T, H] the norm's input (add_rms_norm's sum); dsum: a gradient that reached x by another path (the residual
    stream), added to dx in fp32 before the one rounding."""
    xf, dyf = x.float(), dy.float()
    h = x.shape[-1]
    rstd = torch.rsqrt(tree_sum(xf * xf) / h + eps)[..., None]
    xhat = xf * rstd
    normed = xhat.to(x.dtype).float()
    dn = dyf * weight.float()
    dx = (dn - xhat * (tree_sum(dn * xhat) / h)[..., None]) * rstd
    if dsum is not None:
        dx = dx + dsum.float()
    dw = tree_sum((dyf * normed).reshape(-1, h), dim=0)
    return dx.to(x.dtype), dw.to(weight.dtype)


def silu_and_mul_bwd(dy: torch.Tensor, x: torch.Tensor) -> torch.Tensor:
    """Gradient of silu(gate) * up (x [T, 2I] = gate | up) -> dx [T, 2I] in x.dtype."""
    i = x.shape[-1] // 2
    gate, up, dyf = x[..., :i].float(), x[..., i:].float(), dy.float()
    sig = 1.0 / (1.0 + torch.exp(-gate))
    dgate = dyf * up * sig * (1.0 + gate * (1.0 - sig))
    dup = dyf * gate * sig
    return torch.cat([dgate, dup], dim=-1).to(x.dtype)


def attention_bwd(q, k, v, o, do, cu_seqlens, max_len: int, scale: float):
    """Gradients of o = causal softmax(scale q k^T) v, per whole sequence packed by cu_seqlens, dense in fp32:
    q, o, do [T, Hq, D], k, v [T, Hkv, D] -> (dq, dk, dv) in q.dtype. (max_len: the Triton launcher's grid.)"""
    g = q.shape[1] // k.shape[1]
    dq, dk, dv = (torch.empty_like(q), torch.empty(k.shape, dtype=k.dtype, device=k.device),
                  torch.empty(v.shape, dtype=v.dtype, device=v.device))
    for t0, t1 in itertools.pairwise(cu_seqlens.tolist()):
        qs, os_, dos = q[t0:t1].float(), o[t0:t1].float(), do[t0:t1].float()
        ks = k[t0:t1].float().repeat_interleave(g, dim=1)
        vs = v[t0:t1].float().repeat_interleave(g, dim=1)
        s = torch.einsum("thd,shd->hts", qs, ks) * scale
        future = torch.ones(t1 - t0, t1 - t0, dtype=torch.bool, device=q.device).triu(1)
        p = torch.softmax(s.masked_fill(future, float("-inf")), dim=-1)
        dp = torch.einsum("thd,shd->hts", dos, vs)
        delta = (dos * os_).sum(-1).transpose(0, 1)[..., None]  # [H, T, 1]
        ds = p * (dp - delta)
        dq[t0:t1] = (torch.einsum("hts,shd->thd", ds, ks) * scale).to(q.dtype)
        dk_full = torch.einsum("hts,thd->shd", ds, qs) * scale
        dv_full = torch.einsum("hts,thd->shd", p, dos)
        dk[t0:t1] = dk_full.unflatten(1, (-1, g)).sum(2).to(k.dtype)
        dv[t0:t1] = dv_full.unflatten(1, (-1, g)).sum(2).to(v.dtype)
    return dq, dk, dv
