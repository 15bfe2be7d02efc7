"""GPU proof of the FP8 Triton kernels at the 8B shapes: the quantisation's bits are the torch reference's, every tile
of the table (and the fused decode form) gives a row the same bits, M = 1..8192, and the GEMM computes the recipe."""
import pytest
import torch

from samebits.kernels import fp8
from samebits.kernels.configs import TILE_CONFIGS
from samebits.probe.compare import assert_same_bits, mismatch

pytestmark = pytest.mark.gpu
CHANNEL, BLOCK, STATIC = fp8.Fp8Recipe("channel", "token"), fp8.Fp8Recipe("block", "group", fp8.BLOCK), \
    fp8.Fp8Recipe("channel", "static")
RECIPES = {"channel": CHANNEL, "block": BLOCK, "static": STATIC}
M_SIZES = [1, 2, 3, 4, 5, 7, 15, 16, 17, 31, 33, 63, 64, 65, 127, 255, 256, 257, 1000, 1025, 2049, 4095, 8192]
M_WIDE = [1, 4, 5, 17, 65, 257, 1025, 4095]
SHAPES = [(6144, 4096), (4096, 4096), (28672, 4096), (4096, 14336)]  # 8B: qkv, o, gate_up, down


def tri():
    from samebits.kernels.triton import fp8 as module

    return module


def _gen():
    g = torch.Generator(device="cuda")
    g.manual_seed(torch.seed() % 2**31)
    return g


def operands(recipe, n, k, g):
    w = torch.randn(n, k, generator=g, device="cuda") * k ** -0.5
    q, scale = fp8.quantize_weight(w)
    if recipe.weights == "block":
        scale = torch.rand(-(-n // 128), -(-k // 128), generator=g, device="cuda") * 1e-3 + 1e-3
    input_scale = torch.tensor([0.011], device="cuda") if recipe.activations == "static" else None
    return q, (input_scale * scale if input_scale is not None else scale), input_scale


def activations(m, k, g):
    """bf16 rows of very different loudness, some zero: every row gets its own scale."""
    x = torch.randn(m, k, generator=g, device="cuda") * torch.logspace(-4, 3, m, device="cuda")[:, None] ** 0.5
    x[::97] = 0.0
    return x.to(torch.bfloat16)


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("k", [4096, 14336, 4000])
def test_quantisation_kernel_gives_the_references_bits_on_the_gpu(recipe, k):
    g = _gen()
    x = activations(1000, k, g)
    input_scale = torch.tensor([0.02], device="cuda") if recipe == "static" else None
    q, scale = tri().quantize(x, RECIPES[recipe], input_scale)
    want_q, want_scale = fp8.quantize_activations(x, RECIPES[recipe], input_scale)
    assert torch.equal(q.view(torch.uint8), want_q.view(torch.uint8))
    assert (scale is None and want_scale is None) or torch.equal(scale, want_scale)
    # The same on the CPU: the quantised activations are a function of the row on every device.
    cpu_q, _ = fp8.quantize_activations(x.cpu(), RECIPES[recipe], None if input_scale is None else input_scale.cpu())
    assert torch.equal(q.cpu().view(torch.uint8), cpu_q.view(torch.uint8))


@pytest.mark.parametrize("recipe", sorted(RECIPES))
@pytest.mark.parametrize("n,k", SHAPES)
def test_triton_fp8_linear_rows_invariant_at_8b_shapes(recipe, n, k):
    g = _gen()
    sizes = M_SIZES if n <= 6144 else M_WIDE
    weight, scale, input_scale = operands(RECIPES[recipe], n, k, g)
    bias = torch.randn(n, generator=g, device="cuda").to(torch.bfloat16) if n == 6144 else None
    x = activations(max(sizes), k, g)
    fn = lambda t: tri().linear_fp8(t, weight, scale, RECIPES[recipe], input_scale, bias)
    full = fn(x)
    for m in sizes:
        assert_same_bits(fn(x[:m]), full[:m], f"fp8 {recipe} N={n} K={k}: M={m} vs M={len(x)}")
    perm = torch.randperm(len(x), generator=g, device="cuda")
    assert_same_bits(fn(x[perm]), full[perm], f"fp8 {recipe} N={n} K={k}: permuted rows")


@pytest.mark.parametrize("recipe", ["channel", "block"])
@pytest.mark.parametrize("k", [4096, 14336, 1000])
def test_every_fp8_tile_gives_the_same_bits(recipe, k):
    # The fact the M-bucketed table rests on, as for bf16 (tests/kernels/test_gpu.py): with the K order fixed in
    # k_step blocks, the tile (and whether the GEMM quantises its own rows) changes no bit.
    g = _gen()
    weight, scale, _ = operands(RECIPES[recipe], 1024, k, g)
    x = activations(300, k, g)
    rows = [row[:7] + [fused] for row in TILE_CONFIGS["matmul_fp8"]["config"] for fused in (0, 1)]
    extra = [[0, 64, 256, 128, 8, 3, 8, 0], [0, 128, 64, 128, 4, 4, 8, 0], [0, 128, 256, 128, 8, 3, 8, 0]]
    outs = {str(c): tri().linear_fp8(x, weight, scale, RECIPES[recipe], config=c) for c in rows + extra}
    ref = outs[str(rows[-2])]
    for name, out in outs.items():
        assert_same_bits(out, ref, f"fp8 {recipe} K={k} tile {name}")
    # Negative control: K cut in two halves summed afterwards (a split-K order) is seen by the same comparison.
    w_c, s_c, _ = operands(CHANNEL, 1024, 4096, g)
    q4, s4 = tri().quantize(activations(300, 4096, g), CHANNEL)
    whole = tri().gemm(q4, s4, w_c, s_c, CHANNEL, out_dtype=torch.float32)
    halves = sum(tri().gemm(q4[:, h].contiguous(), s4, w_c[:, h].contiguous(), s_c, CHANNEL, out_dtype=torch.float32)
                 for h in (slice(0, 2048), slice(2048, 4096)))
    assert mismatch(halves, whole).differing > 0, "the control changed no bit"


@pytest.mark.parametrize("recipe", sorted(RECIPES))
def test_the_gpu_gemm_computes_the_recipe(recipe):
    # Each k_step's e4m3 products are summed by the tensor cores in their own precision, then the bf16 rounding.
    g = _gen()
    weight, scale, input_scale = operands(RECIPES[recipe], 4096, 4096, g)
    x = activations(257, 4096, g)
    exact = fp8.reference_linear(x, weight, scale, RECIPES[recipe], input_scale)
    out = tri().linear_fp8(x, weight, scale, RECIPES[recipe], input_scale)
    err = (out.double() - exact).abs().max() / exact.abs().max()
    assert err <= 2 ** -7, f"fp8 {recipe}: max |err| {float(err):.2e} of max |exact|"


def test_linear_in_a_cuda_graph_gives_the_eager_bits():
    g = _gen()
    weight, scale, _ = operands(CHANNEL, 6144, 4096, g)
    for m in (1, 64, 256):
        x = activations(m, 4096, g)
        eager = tri().linear_fp8(x, weight, scale, CHANNEL)
        graph = torch.cuda.CUDAGraph()
        stream = torch.cuda.Stream()
        with torch.cuda.stream(stream):
            tri().linear_fp8(x, weight, scale, CHANNEL)
        with torch.cuda.graph(graph, stream=stream):
            out = tri().linear_fp8(x, weight, scale, CHANNEL)
        graph.replay()
        torch.cuda.synchronize()
        assert_same_bits(out, eager, f"graph vs eager M={m}")
