"""The FP8 Triton kernels on small shapes (interpreter on the CPU, natively where CUDA exists): the quantisation's
bits are the torch reference's, the GEMM computes the recipe, and a row's bits follow neither M, nor the tile, nor
whether the GEMM quantised it itself."""
import pytest
import torch

from samebits.kernels import fp8
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.helpers import fresh_generator

pytestmark = pytest.mark.interpreter
pytest.importorskip("triton")
DEV = "cuda" if torch.cuda.is_available() else "cpu"
CHANNEL, BLOCK, STATIC = fp8.Fp8Recipe("channel", "token"), fp8.Fp8Recipe("block", "group", fp8.BLOCK), \
    fp8.Fp8Recipe("channel", "static")
# [max_M, BM, BN, BK, warps, stages, GROUP_M, FUSED]: the smallest tiles the kernel takes (BM >= 64, BK the k_step).
TILES = [[0, 64, 16, 128, 4, 2, 1, 1], [0, 64, 32, 128, 4, 2, 1, 0], [0, 64, 16, 128, 4, 2, 8, 0]]


def tri():
    from samebits.kernels.triton import fp8 as module

    return module


def operands(recipe, n, k, g):
    """(weight, the scale the linear takes, input_scale), on DEV."""
    q, scale = fp8.quantize_weight(torch.randn(n, k, generator=g) * k ** -0.5)
    input_scale = None
    if recipe.weights == "block":
        scale = torch.rand(-(-n // 128), -(-k // 128), generator=g) * 1e-3 + 1e-3
    elif recipe.activations == "static":
        input_scale = torch.tensor([0.013])
        scale = input_scale * scale
    return q.to(DEV), scale.to(DEV), None if input_scale is None else input_scale.to(DEV)


def test_rounding_to_e4m3_is_torchs_cast():
    # Rows whose max is 448 have the scale 1: the kernel's bit arithmetic against torch's cast on every e4m3 value,
    # every midpoint between two, their neighbours, subnormals and signed zeros (static scales test the clamp).
    values = torch.arange(256, dtype=torch.uint8).view(fp8.FP8).float()
    values = values[torch.isfinite(values)].unique()
    mids = (values[1:] + values[:-1]) / 2
    near = torch.cat([torch.nextafter(mids, mids + 1), torch.nextafter(mids, mids - 1)])
    x = torch.cat([values, mids, near, -mids, -near, torch.tensor([-0.0, 1e-30, -1e-30])])
    rows = torch.nn.functional.pad(x, (0, -x.numel() % 255)).view(-1, 255)
    rows = torch.cat([rows, torch.full((rows.shape[0], 1), fp8.FP8_MAX)], dim=1).to(DEV)
    q, scale = tri().quantize(rows, CHANNEL)
    assert torch.equal(scale.cpu(), torch.ones(rows.shape[0]))
    want = fp8.quantize_activations(rows.cpu(), CHANNEL)[0]
    assert torch.equal(q.cpu().view(torch.uint8), want.view(torch.uint8))


@pytest.mark.parametrize("recipe", [CHANNEL, BLOCK, STATIC], ids=["token", "group", "static"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_quantisation_kernel_gives_the_references_bits(recipe, dtype, seed):
    g = fresh_generator(seed)
    x = (torch.randn(7, 300, generator=g) * torch.logspace(-5, 4, 7)[:, None]).to(dtype)
    x[3] = 0.0
    input_scale = torch.tensor([0.02]) if recipe.activations == "static" else None  # clamps the louder rows
    q, scale = tri().quantize(x.to(DEV), recipe, None if input_scale is None else input_scale.to(DEV))
    want_q, want_scale = fp8.quantize_activations(x, recipe, input_scale)
    assert torch.equal(q.cpu().view(torch.uint8), want_q.view(torch.uint8))
    assert (scale is None and want_scale is None) or torch.equal(scale.cpu(), want_scale)


@pytest.mark.parametrize("recipe", [CHANNEL, BLOCK, STATIC], ids=["channel", "block", "static"])
def test_gemm_computes_the_recipe(recipe, seed):
    g = fresh_generator(seed)
    weight, scale, input_scale = operands(recipe, 48, 300, g)  # K: two steps and a tail
    x, bias = torch.randn(5, 300, generator=g).to(DEV), torch.randn(48, generator=g).to(DEV)
    exact = fp8.reference_linear(x.cpu(), weight.cpu(), scale.cpu(), recipe,
                                 None if input_scale is None else input_scale.cpu(), bias.cpu())
    for tile in TILES[:2]:  # the fused and the unfused form
        out = tri().linear_fp8(x, weight, scale, recipe, input_scale, bias, config=tile)
        assert (out.cpu().double() - exact).abs().max() <= 1e-5 * exact.abs().max(), f"tile {tile}"


@pytest.mark.parametrize("recipe", [CHANNEL, BLOCK], ids=["channel", "block"])
def test_a_rows_bits_follow_neither_m_nor_the_tile(recipe, seed):
    g = fresh_generator(seed)
    weight, scale, _ = operands(recipe, 40, 256, g)
    row = torch.randn(256, generator=g).to(torch.bfloat16).to(DEV)
    alone = tri().linear_fp8(row[None], weight, scale, recipe, config=TILES[0])[0]  # fused, as at batch 1
    for m, tile in ((1, TILES[1]), (3, TILES[2]), (65, TILES[1]), (130, TILES[2])):
        batch = (torch.randn(m, 256, generator=g) * 10.0).to(torch.bfloat16).to(DEV)
        p = int(torch.randint(0, m, (1,), generator=g))
        batch[p] = row
        out = tri().linear_fp8(batch, weight, scale, recipe, config=tile)[p]
        assert_same_bits(out, alone, f"fp8 {recipe.weights} M={m} slot {p} tile {tile}")
    # Negative control: the same row among the same louder rows, its activations scaled per tensor (fast mode's
    # variant recipe), gets other bits.
    per_tensor = fp8.Fp8Recipe("channel", "tensor")
    w_c, s_c, _ = operands(CHANNEL, 40, 256, g)
    variant = tri().linear_fp8(batch, w_c, s_c, per_tensor, config=TILES[1])[p]
    assert mismatch(variant, tri().linear_fp8(row[None], w_c, s_c, per_tensor, config=TILES[1])[0]).differing
