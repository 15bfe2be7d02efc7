"""The vendor FP8 route (torch._scaled_mm): taken only inside its domain, after a self-test, and then bit-equal to the
Triton kernels at every M; fast mode's per-tensor dynamic recipe is batch-variant (the negative control)."""
import pytest
import torch

import samebits.kernels as K
from samebits.kernels import fp8, get_ops, vendor_gemm
from samebits.kernels import vendor_fp8 as vf
from samebits.kernels.configs import TILE_CONFIGS
from samebits.probe.compare import assert_same_bits, mismatch

CFG = TILE_CONFIGS["vendor_fp8"]["config"]
CHANNEL, STATIC = fp8.Fp8Recipe("channel", "token"), fp8.Fp8Recipe("channel", "static")


@pytest.mark.parametrize("n,k,recipe,dtype,ok", [
    (4096, 4096, CHANNEL, torch.bfloat16, True),
    (6144, 4096, STATIC, torch.bfloat16, True),
    (4096, 4096, fp8.Fp8Recipe("block", "group", fp8.BLOCK), torch.bfloat16, False),  # no block-scaled route
    (4096, 4096, fp8.Fp8Recipe("channel", "tensor"), torch.bfloat16, False),  # never in deterministic mode
    (4096, 4000, CHANNEL, torch.bfloat16, False),  # a K tail
    (4100, 4096, CHANNEL, torch.bfloat16, False),  # N off the kernel's alignment
    (4096, 4096, CHANNEL, torch.float32, False),  # the row-wise kernel writes bf16 only
])
def test_shape_domain(n, k, recipe, dtype, ok):
    assert vf.shape_allowed(n, k, recipe, dtype) is ok


def test_the_cpu_never_takes_the_route():
    q, _ = fp8.quantize_weight(torch.randn(256, 256))
    assert not vf.eligible(torch.randn(4096, 256).bfloat16(), q, CHANNEL, None)


gpu = pytest.mark.gpu


def _weights(n, k, g):
    return fp8.quantize_weight(torch.randn(n, k, generator=g, device="cuda") * k ** -0.5)


@gpu
@pytest.mark.parametrize("recipe", [CHANNEL, STATIC], ids=["token", "static"])
@pytest.mark.parametrize("n,k", [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)])
def test_deterministic_fp8_linear_is_row_invariant_and_the_triton_bits(recipe, n, k):
    """The engine's op at 8B shapes: where the vendor's self-test passed it serves M >= min_m, and the bits are the
    Triton kernels' at every M either way."""
    from samebits.kernels.triton import fp8 as tri

    g = torch.Generator(device="cuda").manual_seed(n + k)
    weight, scale = _weights(n, k, g)
    input_scale = torch.tensor([0.01], device="cuda") if recipe.activations == "static" else None
    scale = scale if input_scale is None else input_scale * scale
    vf.prove_weights([weight])
    proven = vf.verdicts()[f"{n}x{k} fp8 cuda:{torch.cuda.current_device()}"]
    x = torch.randn(8192, k, generator=g, device="cuda").to(torch.bfloat16)
    det = get_ops("deterministic", "cuda")
    full = det.linear_fp8(x, weight, scale, recipe, input_scale)
    assert_same_bits(full, tri.linear_fp8(x, weight, scale, recipe, input_scale), f"vendor proven={proven}")
    for m in (1, 3, 4, 5, 17, 64, 127, CFG["min_m"], 129, 192, 255, 1000, 3001, 4096):
        out = det.linear_fp8(x[:m], weight, scale, recipe, input_scale)
        assert_same_bits(out, full[:m], f"N={n} K={k} M={m} (vendor proven={proven})")
    assert vf.eligible(x, weight, recipe, None) == (proven and vendor_gemm.workspace_pinned())


@gpu
def test_fast_mode_per_tensor_dynamic_scales_are_batch_variant():
    """The negative control at the op: the row's output follows its neighbours' loudness."""
    g = torch.Generator(device="cuda").manual_seed(0)
    weight, scale = _weights(4096, 4096, g)
    per_tensor = fp8.Fp8Recipe("channel", "tensor")
    batch = torch.randn(64, 4096, generator=g, device="cuda").to(torch.bfloat16)
    batch[1:] *= 8
    fast = get_ops("fast", "cuda").linear_fp8
    assert mismatch(fast(batch, weight, scale, per_tensor)[0], fast(batch[:1], weight, scale, per_tensor)[0]).differing
    with pytest.raises(K.UnsupportedOpError, match="per token"):
        get_ops("deterministic", "cuda").linear_fp8(batch, weight, scale, per_tensor)


@gpu
def test_a_failed_self_test_leaves_the_shape_on_triton(monkeypatch):
    def wrong(q, a_scale, weight, w_scale, fast_accum):
        return torch.zeros(q.shape[0], weight.shape[0], dtype=torch.bfloat16, device=q.device)

    monkeypatch.setattr(vf, "scaled_mm", wrong)
    monkeypatch.setattr(vf, "_VERDICTS", {})
    weight, scale = _weights(2048, 4096, torch.Generator(device="cuda").manual_seed(1))
    vf.prove_weights([weight])
    x = torch.randn(512, 4096, device="cuda").to(torch.bfloat16)
    assert not vf.eligible(x, weight, CHANNEL, None)
    assert get_ops("deterministic", "cuda").linear_fp8(x, weight, scale, CHANNEL).abs().max() > 0
