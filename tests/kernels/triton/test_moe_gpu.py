"""GPU proof of the fused MoE kernels at real expert shapes (Qwen3-30B-A3B: 128 experts of 768, hidden 2048, top 8;
Mixtral-8x7B: 8 of 14336, hidden 4096, top 2): the dense kernel's bits per expert at every tile of the table, a token's
bits whatever its experts' loads and the batch size, the same bits replayed from a CUDA graph, fast mode's grouped GEMM close."""
import pytest
import torch

from samebits.kernels import moe
from samebits.kernels.configs import TILE_CONFIGS
from samebits.probe.compare import assert_same_bits

pytestmark = pytest.mark.gpu
SHAPES = {"qwen3-30b-a3b": (128, 2048, 768, 8), "mixtral-8x7b": (8, 4096, 14336, 2)}  # E, H, I, k
TOKENS = [1, 2, 7, 33, 64, 257, 1025, 2048]


def _tm():
    from samebits.kernels.triton import moe as tm

    return tm


def _gen(seed):
    g = torch.Generator(device="cuda")
    g.manual_seed(seed)
    return g


def _weights(shape, g, dtype=torch.bfloat16):
    e, h, i, _ = shape
    w13 = (torch.randn(e, 2 * i, h, generator=g, device="cuda") * h ** -0.5).to(dtype)
    w2 = (torch.randn(e, h, i, generator=g, device="cuda") * i ** -0.5).to(dtype)
    return w13, w2


def _tokens(shape, t, g, dtype=torch.bfloat16):
    e, h, _, k = shape
    x = torch.randn(t, h, generator=g, device="cuda").to(dtype)
    probs = torch.softmax(torch.randn(t, e, generator=g, device="cuda"), -1)
    ids = moe.topk_ids(probs, k)
    return x, ids, moe.topk_weights(probs, ids, True)


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_fused_experts_equal_the_dense_kernel_per_expert_at_every_tile(name, seed):
    tm, shape, g = _tm(), SHAPES[name], _gen(seed)
    w13, w2 = _weights(shape, g)
    x, ids, w = _tokens(shape, 300, g)
    ref = tm.reference(x, w13, w2, ids, w)
    for tile in TILE_CONFIGS["moe"]["config"]["tiles"]:
        assert_same_bits(tm.fused_experts(x, w13, w2, ids, w, config=tile), ref, f"{name} tile {tile}")


@pytest.mark.parametrize("name", sorted(SHAPES))
def test_a_token_gets_the_same_bits_alone_and_in_any_batch_whatever_its_experts_load(name, seed):
    tm, shape, g = _tm(), SHAPES[name], _gen(seed)
    w13, w2 = _weights(shape, g)
    needle, n_ids, n_w = _tokens(shape, 1, g)
    alone = tm.fused_experts(needle, w13, w2, n_ids, n_w)
    for t in TOKENS:
        x, ids, w = _tokens(shape, t, g)
        crowd = torch.arange(t, device="cuda") < t // 2  # half the batch onto the needle's experts
        ids[crowd] = n_ids[0]
        at = int(torch.randint(0, t, (1,), generator=g, device="cuda"))
        x[at], ids[at], w[at] = needle[0], n_ids[0], n_w[0]
        assert_same_bits(tm.fused_experts(x, w13, w2, ids, w)[at:at + 1], alone, f"{name}: T={t} slot {at}")


def test_a_captured_step_replays_the_eager_bits(seed):
    tm, shape, g = _tm(), SHAPES["qwen3-30b-a3b"], _gen(seed)
    w13, w2 = _weights(shape, g)
    x, ids, w = _tokens(shape, 64, g)
    static = [x.clone(), ids.clone(), w.clone()]
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        tm.fused_experts(*static[:1], w13, w2, *static[1:])  # compiles outside the capture
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = tm.fused_experts(static[0], w13, w2, static[1], static[2])
    for _ in range(2):  # new routing each replay: the grid is fixed, the blocks follow the device data
        x, ids, w = _tokens(shape, 64, g)
        for dst, src in zip(static, (x, ids, w)):
            dst.copy_(src)
        graph.replay()
        assert_same_bits(out, tm.fused_experts(x, w13, w2, ids, w), "graph replay vs eager")


def test_fast_mode_route_is_close(seed):
    from samebits.kernels import get_ops

    fast, shape, g = get_ops("fast", "cuda"), SHAPES["qwen3-30b-a3b"], _gen(seed)
    w13, w2 = _weights(shape, g)
    x, ids, w = _tokens(shape, 257, g)
    ref = _tm().reference(x, w13, w2, ids, w).float()
    got = fast.moe_experts(x, w13, w2, ids, w).float()
    assert (got - ref).abs().max() <= 2 ** -6 * ref.abs().max()
