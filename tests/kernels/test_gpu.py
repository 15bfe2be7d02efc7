"""GPU proof at real shapes: bitwise batch invariance of the Triton kernels, and the measured facts they rest on."""
import pytest
import torch

import samebits.kernels as K
from samebits.probe.compare import assert_same_bits, mismatch

pytestmark = pytest.mark.gpu
KDIM = 4096
# M from 1 to 8192, odd sizes included; every matmul bucket boundary and its neighbours.
M_SIZES = [1, 2, 3, 7, 15, 16, 17, 31, 32, 33, 63, 64, 65, 127, 255, 256, 257, 1000, 1023, 1025, 2049, 4095, 8192]
M_SIZES_WIDE = [1, 3, 17, 33, 65, 257, 1025, 4095]


def _gen():
    g = torch.Generator(device="cuda")
    g.manual_seed(torch.seed() % 2**31)
    return g


def _randn(shape, dtype, g, scale=1.0):
    return (torch.randn(shape, generator=g, device="cuda", dtype=torch.float32) * scale).to(dtype)


def _check_prefixes(fn, x, sizes, what, g):
    """fn over the first m rows must equal fn over all rows, row for row, and under a random row order."""
    full = fn(x)
    for m in sizes:
        assert_same_bits(fn(x[:m]), full[:m], f"{what}: M={m} vs M={len(x)}")
    perm = torch.randperm(len(x), generator=g, device="cuda")
    assert_same_bits(fn(x[perm]), full[perm], f"{what}: permuted rows")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n", [4096, 6144, 28672, 128256])
def test_linear_invariant_at_real_shapes(n, dtype):
    g = _gen()
    sizes = M_SIZES if n <= 6144 else M_SIZES_WIDE
    w = _randn((n, KDIM), dtype, g, KDIM ** -0.5)
    x = _randn((max(sizes), KDIM), dtype, g)
    bias = _randn((n,), dtype, g) if n == 6144 else None
    _check_prefixes(lambda t: K.linear(t, w, bias), x, sizes, f"linear N={n} {dtype}", g)


def test_linear_fp32_invariant():
    g = _gen()
    w, x = _randn((1024, 1024), torch.float32, g), _randn((1025, 1024), torch.float32, g)
    _check_prefixes(lambda t: K.linear(t, w), x, [1, 17, 64, 65, 300], "linear fp32", g)


@pytest.mark.parametrize("k", [4096, 1000, 576, 14336])
def test_every_tile_in_the_table_gives_the_same_bits(k):
    # The measured fact the M-bucketed tiles rest on: sequential-K tl.dot order is independent of the tile.
    import samebits.kernels.triton.matmul as tm
    from samebits.kernels.configs import TILE_CONFIGS

    g = _gen()
    x, w = _randn((300, k), torch.bfloat16, g), _randn((1024, k), torch.bfloat16, g, k ** -0.5)
    configs = TILE_CONFIGS["matmul"]["config"] + [[0, 64, 32, 32, 4, 3, 1], [0, 128, 128, 128, 8, 3, 8]]
    ref = tm.linear(x, w, config=configs[-1])
    for cfg in configs:
        assert_same_bits(tm.linear(x, w, config=cfg), ref, f"K={k} tile {cfg[1:]}")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_row_ops_invariant_at_real_shapes(dtype):
    g = _gen()
    h, v = 4096, 128256
    x, w, r = _randn((4097, h), dtype, g), _randn((h,), dtype, g), _randn((4097, h), dtype, g)
    sizes = [1, 2, 3, 17, 64, 65, 1000, 4096]
    _check_prefixes(lambda t: K.rms_norm(t, w, 1e-5), x, sizes, f"rms_norm {dtype}", g)
    xr = torch.cat([x, r], dim=1)
    _check_prefixes(lambda t: torch.cat(K.add_rms_norm(t[:, :h], t[:, h:], w, 1e-5), 1), xr, sizes,
                    f"add_rms_norm {dtype}", g)
    _check_prefixes(lambda t: K.det_sum(t, -1), x, sizes, f"det_sum rows {dtype}", g)
    logits = _randn((257, v), dtype, g, 4.0)
    _check_prefixes(K.log_softmax, logits, [1, 2, 33, 256], f"log_softmax V={v} {dtype}", g)
    _check_prefixes(K.softmax, logits, [1, 7, 128], f"softmax V={v} {dtype}", g)


def test_values_match_float64():
    g = _gen()
    x, w = _randn((65, KDIM), torch.bfloat16, g), _randn((4096, KDIM), torch.bfloat16, g, KDIM ** -0.5)
    ref = x.double() @ w.double().t()
    assert (K.linear(x, w).double() - ref).abs().max() <= 8e-3 * ref.abs().max()
    logits = _randn((3, 128256), torch.float32, g, 4.0)
    assert (K.log_softmax(logits).double() - torch.log_softmax(logits.double(), -1)).abs().max() < 1e-4
    nw = _randn((KDIM,), torch.float32, g)
    rref = x.double() * torch.rsqrt(x.double().pow(2).mean(-1, keepdim=True) + 1e-5) * nw.double()
    assert (K.rms_norm(x.float(), nw, 1e-5).double() - rref).abs().max() <= 1e-5 * rref.abs().max()
    big = _randn((1 << 24,), torch.float32, g)
    assert abs(K.det_sum(big).item() - big.double().sum().item()) <= 1e-6 * big.abs().sum().item()


def test_det_sum_is_run_to_run_and_view_stable():
    g = _gen()
    x = _randn((1 << 22,), torch.float32, g)
    first = K.det_sum(x)
    for _ in range(5):
        assert torch.equal(K.det_sum(x), first)
    assert torch.equal(K.det_sum(x.view(1024, 4096)), first)


def test_vendor_matmul_differs_with_m():
    # Negative control: stock cuBLAS changes row 0 with M at this shape (measured: from M >= 64).
    g = _gen()
    w, x = _randn((KDIM, 4096), torch.bfloat16, g), _randn((4096, KDIM), torch.bfloat16, g)
    row0 = (x[:1] @ w)[0]
    differing = [m for m in (2, 64, 256, 1024, 4096) if not mismatch((x[:m] @ w)[0], row0).same]
    if not differing:
        pytest.skip("stock cuBLAS happened to be invariant here")
    with pytest.raises(AssertionError):
        assert_same_bits((x[:differing[0]] @ w)[0], row0, "vendor")


def test_dropin_llama_on_cuda():
    transformers = pytest.importorskip("transformers")
    import samebits

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=256, intermediate_size=512, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, attn_implementation="eager")
    model = transformers.LlamaForCausalLM(cfg).to("cuda", torch.bfloat16).eval()
    g = _gen()
    ids = torch.randint(0, 512, (33, 9), generator=g, device="cuda")
    with torch.no_grad(), samebits.batch_invariant():
        alone = model(input_ids=ids[5:6]).logits[0]
        for b in (8, 33):
            assert_same_bits(model(input_ids=ids[:b]).logits[5], alone, f"drop-in Llama cuda batch {b}")


def test_fused_race_equals_the_torch_race_at_a_real_vocabulary():
    """The fused kernel against the same race in torch ops on this GPU: every token and every winning key's bits, at
    256 rows of a 128k vocabulary (filtered rows included); a row's result does not depend on the rows beside it; the
    CPU reference draws the same tokens."""
    from samebits.kernels.race import gumbel_race as torch_race

    g = _gen()
    z = torch.randn(256, 128256, generator=g, device="cuda") * torch.rand(256, 1, generator=g, device="cuda") * 8
    z[::3] = z[::3].masked_fill(torch.rand(z[::3].shape, generator=g, device="cuda") < 0.9, float("-inf"))
    seeds = torch.randint(-2**63, 2**63 - 1, (256,), generator=g, device="cuda")
    samples, positions = (torch.randint(0, 2**32, (256,), generator=g, device="cuda") for _ in range(2))
    got, want = K.gumbel_race(z, seeds, samples, positions, 0), torch_race(z, seeds, samples, positions, 0)
    assert_same_bits(got[0], want[0], "tokens: fused vs torch race on CUDA")
    assert_same_bits(got[1], want[1], "winning keys: fused vs torch race on CUDA")
    sub = torch.tensor([5, 0, 255, 17], device="cuda")
    alone = K.gumbel_race(z[sub], seeds[sub], samples[sub], positions[sub], 0)
    assert_same_bits(alone[0], got[0][sub], "tokens of rows raced apart")
    cpu = torch_race(z.cpu(), seeds.cpu(), samples.cpu(), positions.cpu(), 0)
    assert_same_bits(cpu[0], got[0].cpu(), "tokens: CPU reference vs CUDA kernel")
    other = K.gumbel_race(z, seeds, samples, positions, 1)  # negative control: another stream, other draws
    assert mismatch(other[0], got[0]).differing > 0


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_fused_silu_and_mul_gives_the_torch_forms_bits(dtype):
    """The fused kernel against the unfused torch form on this GPU, every element, at the 8B MLP width with odd row
    counts and extreme values (exp overflow and underflow, denormals, zeros)."""
    from samebits.kernels.activation import silu_and_mul as torch_form

    g = _gen()
    x = _randn((1025, 2 * 14336), dtype, g, 8.0)
    x[0, :8] = torch.tensor([100.0, -100.0, 88.0, -88.0, 1e-40, -1e-40, 0.0, -0.0], dtype=dtype)
    assert_same_bits(K.silu_and_mul(x), torch_form(x), f"silu_and_mul {dtype}: fused vs torch")
    assert_same_bits(K.silu_and_mul(x[7:8]), K.silu_and_mul(x)[7:8], f"silu_and_mul {dtype}: a row alone")


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_rope_launch_gives_the_torch_ops_bits_at_the_8b_shape(dtype):
    """q and k (strided views of one qkv row, 32 and 8 heads of 128) rotated in one launch against the torch op on
    this GPU, every element, with a row alone equal to its batched row."""
    from samebits.kernels.rope import apply_rope as torch_rope
    from samebits.kernels.triton.rope import apply_rope
    from samebits.models.rope_scaling import rope_cos_sin

    g = _gen()
    qkv = _randn((257, 48, 128), dtype, g, 4.0)
    q, k = qkv[:, :32], qkv[:, 32:40]
    positions = torch.randint(0, 8192, (257,), generator=g, device="cuda")
    table = rope_cos_sin(128, 8192, 500000.0, device="cuda")
    got = apply_rope(q, k, positions, table)
    for a, b, name in zip(got, torch_rope(q, k, positions, table), ("q", "k")):
        assert_same_bits(a, b, f"rope {name} {dtype}: one launch vs the torch op")
    for a, b in zip(apply_rope(q[9:10], k[9:10], positions[9:10], table), got):
        assert_same_bits(a, b[9:10], f"rope {dtype}: a row alone")
    if dtype == torch.bfloat16:  # negative control: a form that rounds its products to bf16 first is seen
        rows = table[positions][:, None, :]
        x1, x2 = q[..., :64], q[..., 64:]
        rounded = torch.cat([x1 * rows[..., :64].to(dtype) - x2 * rows[..., 64:].to(dtype),
                             x2 * rows[..., :64].to(dtype) + x1 * rows[..., 64:].to(dtype)], dim=-1)
        assert mismatch(rounded, got[0]).differing > 0, "the control changed no bit"
