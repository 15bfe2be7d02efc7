"""The trainer's Triton backward ops (kernels/triton/grads.py) against the torch forms (kernels/grads.py): under
TRITON_INTERPRET=1 on a CPU machine at tiny shapes, and on a GPU at a 1B layer's; the same bits run to run; sums over
the tokens in their written order (a token moved within its split changes a bias gradient's bits: the negative
control)."""
from __future__ import annotations

import pytest
import torch

from samebits.kernels import grads as torch_grads
from samebits.kernels.grads import GRADS, get_grads
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.helpers import fresh_generator

triton_grads = pytest.importorskip("samebits.kernels.triton.grads")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def rand(*shape, g, dtype=torch.float32):
    return torch.randn(*shape, generator=g).to(device=DEVICE, dtype=dtype)


def close(a, b, tol, what):
    err = float((a.float() - b.float()).abs().max() / b.float().abs().max())
    assert err <= tol, f"{what}: max |err| / max |ref| = {err:.2e} > {tol:.0e}"


def test_every_backend_defines_every_backward_op():
    for device in ("cpu", "cuda"):
        backend = get_grads(device)
        assert [n for n in GRADS if not callable(getattr(backend, n, None))] == [], device


def check_ops(t, h, inter, dtype, tol, g):
    x, dy, ds, w = rand(t, h, g=g, dtype=dtype), rand(t, h, g=g, dtype=dtype), rand(t, h, g=g, dtype=dtype), \
        (1 + 0.1 * rand(h, g=g)).to(dtype)
    for dsum in (None, ds):
        got, want = triton_grads.rms_norm_bwd(dy, x, w, 1e-5, dsum), torch_grads.rms_norm_bwd(dy, x, w, 1e-5, dsum)
        close(got[0], want[0], tol, "rms_norm dx")
        close(got[1], want[1], tol, "rms_norm dweight")
        again = triton_grads.rms_norm_bwd(dy, x, w, 1e-5, dsum)
        assert_same_bits(again[1], got[1], "rms_norm dweight run to run")
    gate_up, dact = rand(t, 2 * inter, g=g, dtype=dtype), rand(t, inter, g=g, dtype=dtype)
    close(triton_grads.silu_and_mul_bwd(dact, gate_up), torch_grads.silu_and_mul_bwd(dact, gate_up), tol, "silu")
    db = triton_grads.bias_grad(dy)
    close(db, torch_grads.bias_grad(dy), tol, "bias")
    # Full fp32 mantissas (sums of bf16 values can be exact in fp32 in any order); the first token last in its split.
    full = rand(t, h, g=g)
    moved = torch.cat([full[1:32], full[:1], full[32:]])
    assert not mismatch(triton_grads.bias_grad(moved), triton_grads.bias_grad(full)).same, \
        "a token moved: the split sum saw no change"
    weight = rand(3 * h // 2, h, g=g, dtype=dtype) * h ** -0.5
    dy_out, xin = rand(t, 3 * h // 2, g=g, dtype=dtype), rand(t, h, g=g, dtype=dtype)
    close(triton_grads.linear_dx(dy_out, weight), torch_grads.linear_dx(dy_out, weight), tol, "linear dx")
    dw = triton_grads.linear_dw(dy_out, xin)
    close(dw, torch_grads.linear_dw(dy_out, xin), tol, "linear dw")
    assert_same_bits(triton_grads.linear_dw(dy_out, xin), dw, "linear dw run to run")


@pytest.mark.interpreter
def test_backward_ops_match_the_torch_forms(seed):
    check_ops(37, 96, 48, torch.float32, 2e-6, fresh_generator(seed))


@pytest.mark.gpu
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 2e-5), (torch.bfloat16, 2e-2)])
def test_backward_ops_match_the_torch_forms_at_a_1b_layer(dtype, tol, seed):
    check_ops(4752, 2048, 8192, dtype, tol, fresh_generator(seed))
