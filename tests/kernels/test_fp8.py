"""The FP8 recipe (kernels/fp8.py) and its CPU route (kernels/cpu/fp8.py): quantisation, exact value, row invariance,
the refusal of per-tensor dynamic scales."""
import pytest
import torch

from samebits.kernels import fp8, get_ops
from samebits.kernels.common import UnsupportedOpError
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.helpers import fresh_generator

CHANNEL, BLOCK, STATIC = fp8.Fp8Recipe("channel", "token"), fp8.Fp8Recipe("block", "group", fp8.BLOCK), \
    fp8.Fp8Recipe("channel", "static")
PER_TENSOR = fp8.Fp8Recipe("channel", "tensor")


def block_weights(n, k, g):
    """e4m3 weights [n, k] and one scale per 128x128 block."""
    w = torch.randn(n, k, generator=g) * k ** -0.5
    q, _ = fp8.quantize_weight(w)
    return q, torch.rand(-(-n // 128), -(-k // 128), generator=g) * 1e-3 + 1e-3


def weights_for(recipe, n, k, g):
    """(weight, scale as the linear takes it, input_scale)."""
    if recipe.weights == "block":
        return *block_weights(n, k, g), None
    q, scale = fp8.quantize_weight(torch.randn(n, k, generator=g) * k ** -0.5)
    if recipe.activations == "static":
        input_scale = torch.tensor([0.011])
        return q, input_scale * scale, input_scale
    return q, scale, None


def test_activation_scales_are_the_least_power_of_two_that_fits(seed):
    g = fresh_generator(seed)
    x = torch.randn(6, 300, generator=g) * torch.logspace(-6, 3, 6)[:, None]
    x[5] = 0.0
    q, scale = fp8.quantize_activations(x, CHANNEL)
    amax = x.abs().amax(-1)
    assert torch.equal(scale, torch.exp2(torch.round(torch.log2(scale))))  # powers of two
    assert (amax[:5] <= fp8.FP8_MAX * scale[:5]).all() and (amax[:5] > fp8.FP8_MAX * scale[:5] / 2).all()
    assert scale[5] == 2.0 ** fp8.MIN_SCALE_EXP and not q[5].float().any()
    # Each value is x / scale rounded to the nearest e4m3 value: within half its spacing (3 mantissa bits).
    y = x[:5] / scale[:5, None]
    assert ((q[:5].float() - y).abs() <= y.abs() * 2.0 ** -4 + 2.0 ** -10).all()
    groups = fp8.quantize_activations(x, BLOCK)[1]
    assert groups.shape == (6, 3) and (groups <= scale[:, None]).all()  # a group's max is at most its row's


def test_per_tensor_scale_is_the_batchs_and_the_static_one_the_checkpoints(seed):
    g = fresh_generator(seed)
    x = torch.randn(4, 64, generator=g)
    x[2] *= 100
    _, scale = fp8.quantize_activations(x, PER_TENSOR)
    assert torch.equal(scale, torch.full((4,), float(x.abs().max() / fp8.FP8_MAX)))
    q, none = fp8.quantize_activations(x, STATIC, torch.tensor([0.5]))
    assert none is None and torch.equal(q, fp8.to_fp8(x / 0.5))


def test_online_weight_quantisation_is_per_row(seed):
    g = fresh_generator(seed)
    w = torch.randn(8, 100, generator=g)
    w[3] = 0.0
    q, scale = fp8.quantize_weight(w)
    assert torch.equal(scale[3], torch.tensor(1.0)) and torch.equal(scale[:3], w[:3].abs().amax(-1) / fp8.FP8_MAX)
    assert (q.float().abs().amax(-1)[[0, 1, 2, 4]] == fp8.FP8_MAX).all()
    _, per_tensor = fp8.quantize_weight(w, per_tensor=True)
    assert torch.equal(per_tensor, torch.full((8,), float(w.abs().max() / fp8.FP8_MAX)))


@pytest.mark.parametrize("kw,named", [
    ({"weights": "row", "activations": "token"}, "weights"),
    ({"weights": "channel", "activations": "batch"}, "activations"),
    ({"weights": "block", "activations": "group", "block": (64, 64)}, "weight_block_size"),
    ({"weights": "block", "activations": "token", "block": (128, 128)}, "group"),
    ({"weights": "channel", "activations": "group"}, "group"),
])
def test_recipes_outside_the_supported_set_are_named(kw, named):
    with pytest.raises(ValueError, match=named):
        fp8.Fp8Recipe(**kw)


@pytest.mark.parametrize("recipe", [CHANNEL, BLOCK, STATIC], ids=["channel", "block", "static"])
def test_cpu_route_computes_the_recipe(recipe, seed):
    g = fresh_generator(seed)
    x, bias = torch.randn(5, 300, generator=g), torch.randn(64, generator=g)  # K: two steps and a tail
    weight, scale, input_scale = weights_for(recipe, 64, 300, g)
    out = get_ops("deterministic", "cpu").linear_fp8(x, weight, scale, recipe, input_scale, bias)
    exact = fp8.reference_linear(x, weight, scale, recipe, input_scale, bias)
    # float32 sums of each step's 128 exact products, then two scalings: a few float32 ulps.
    assert (out.double() - exact).abs().max() <= 1e-5 * exact.abs().max()
    fast = get_ops("fast", "cpu").linear_fp8(x, weight, scale, recipe, input_scale, bias)
    assert (fast.double() - exact).abs().max() <= 1e-5 * exact.abs().max()  # the dequantised vendor form


@pytest.mark.parametrize("recipe", [CHANNEL, BLOCK], ids=["channel", "block"])
def test_cpu_route_rows_do_not_see_their_batch(recipe, seed):
    g = fresh_generator(seed)
    weight, scale, _ = weights_for(recipe, 64, 256, g)
    linear = get_ops("deterministic", "cpu").linear_fp8
    row = torch.randn(256, generator=g)
    alone = linear(row[None], weight, scale, recipe)[0]
    for m in (2, 17, 70):
        batch = torch.randn(m, 256, generator=g) * 10.0  # louder neighbours: a batch-wide scale would move
        batch[m // 2] = row
        assert_same_bits(linear(batch, weight, scale, recipe)[m // 2], alone, f"cpu fp8 {recipe.weights} M={m}")
    # Negative control: the per-tensor dynamic recipe (fast mode) changes the row's bits among louder rows.
    fast = get_ops("fast", "cpu").linear_fp8
    w_c, s_c, _ = weights_for(CHANNEL, 64, 256, g)
    batch[m // 2] = row
    assert mismatch(fast(batch, w_c, s_c, PER_TENSOR)[m // 2], fast(row[None], w_c, s_c, PER_TENSOR)[0]).differing


def test_deterministic_mode_refuses_per_tensor_dynamic_scales(seed):
    g = fresh_generator(seed)
    weight, scale, _ = weights_for(CHANNEL, 32, 128, g)
    with pytest.raises(UnsupportedOpError, match="batch-variant.*per token"):
        get_ops("deterministic", "cpu").linear_fp8(torch.randn(2, 128, generator=g), weight, scale, PER_TENSOR)


def test_bad_inputs_are_named(seed):
    g = fresh_generator(seed)
    weight, scale, _ = weights_for(CHANNEL, 32, 128, g)
    linear, x = get_ops("deterministic", "cpu").linear_fp8, torch.randn(2, 128, generator=g)
    with pytest.raises(ValueError, match="weight must be 2-D"):
        linear(x, weight.float(), scale, CHANNEL)
    with pytest.raises(ValueError, match=r"scale must be float32 \(32,\)"):
        linear(x, weight, scale[:8], CHANNEL)
    with pytest.raises(ValueError, match="input_scale goes with static"):
        linear(x, weight, scale, CHANNEL, torch.tensor([1.0]))
    with pytest.raises(ValueError, match=r"need x \[..., K\]"):
        linear(x[:, :64], weight, scale, CHANNEL)
