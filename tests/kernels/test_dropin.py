"""`samebits.batch_invariant()`: a transformers Llama gives a row the same logits alone and inside any batch."""
import pytest
import torch

import samebits
import samebits.kernels as K
from samebits.kernels import UnsupportedOpError
from samebits.kernels.dropin import active
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.helpers import fresh_generator, rand

transformers = pytest.importorskip("transformers")
T = 12
BATCHES = [2, 3, 5, 8, 17, 33, 64]


def _model(dtype):
    cfg = transformers.LlamaConfig(vocab_size=256, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
                                   attn_implementation="eager")
    torch.manual_seed(int(torch.seed() % 2**31))
    return transformers.LlamaForCausalLM(cfg).to(dtype).eval()


def _logits(model, ids):
    with torch.no_grad():
        return model(input_ids=ids).logits


def _alone_vs_batches(model, g, t=T):
    row = torch.randint(0, 256, (1, t), generator=g)
    alone = _logits(model, row)[0]
    results = []
    for b in BATCHES:
        ids = torch.randint(0, 256, (b, t), generator=g)
        p = int(torch.randint(0, b, (1,), generator=g))
        ids[p] = row[0]
        results.append((b, p, alone, _logits(model, ids)[p]))
    return results


@pytest.mark.parametrize("t", [T, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_row_alone_equals_row_in_batch_inside_the_mode(dtype, t, seed):
    model, g = _model(dtype), fresh_generator(seed)
    with samebits.batch_invariant():
        for b, p, alone, batched in _alone_vs_batches(model, g, t):
            assert_same_bits(batched, alone, f"Llama {dtype} logits: alone vs slot {p} of batch {b}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_llama_outside_the_mode_can_differ(dtype, seed):
    # Negative control: stock CPU kernels change a row's logits with the batch on this machine. One-token
    # prompts make M = batch size, so the row alone takes MKL's GEMV path and the batch its GEMM path.
    model, g = _model(dtype), fresh_generator(seed)
    differing = [b for b, _, alone, batched in _alone_vs_batches(model, g, 1) if not mismatch(batched, alone).same]
    if not differing:
        pytest.skip(f"stock torch happened to be batch-invariant for this model ({dtype}) here")
    assert not active()


def test_mode_is_close_to_stock_torch(seed):
    model, g = _model(torch.float32), fresh_generator(seed)
    ids = torch.randint(0, 256, (3, T), generator=g)
    stock = _logits(model, ids)
    with samebits.batch_invariant():
        inv = _logits(model, ids)
    assert (inv - stock).abs().max() <= 1e-4 * stock.abs().max()


def test_overridden_ops_go_through_samebits(seed):
    g = fresh_generator(seed)
    x, w = rand((6, 40), torch.float32, g), rand((24, 40), torch.float32, g)
    with samebits.batch_invariant():
        assert torch.equal(torch.nn.functional.linear(x, w), K.linear(x, w))
        assert torch.equal(x @ w.t(), K.matmul(x, w.t()))
        assert torch.equal(torch.softmax(x, -1), K.softmax(x))
        assert torch.equal(torch.log_softmax(x, 0), K.log_softmax(x, 0))
        assert torch.equal(x.mean(-1), K.det_mean(x, -1))
        assert torch.equal(x.sum(-1, keepdim=True), K.det_sum(x, -1)[:, None])
        assert torch.equal(x.sum(), K.det_sum(x))
        if hasattr(torch.nn.functional, "rms_norm"):
            assert torch.equal(torch.nn.functional.rms_norm(x, (40,), eps=1e-6), K.rms_norm(x, torch.ones(40), 1e-6))
        assert torch.equal(torch.ones(4, 5, dtype=torch.int64).sum(0), torch.full((5,), 4))


def test_mode_fails_loud_on_float64():
    with samebits.batch_invariant(), pytest.raises(UnsupportedOpError, match=r"aten::mm.*float64.*cpu.*\(3, 4\)"):
        torch.ones(3, 4, dtype=torch.float64) @ torch.ones(4, 2, dtype=torch.float64)


def test_nesting_keeps_the_outer_registration(seed):
    g = fresh_generator(seed)
    x, w = rand((5, 32), torch.float32, g), rand((32, 16), torch.float32, g)
    with samebits.batch_invariant():
        with samebits.batch_invariant():
            assert active()
        assert active(), "the inner exit tore down the outer registration"
        assert torch.equal(x @ w, K.matmul(x, w))
    assert not active()


def test_exception_inside_the_block_restores_stock_kernels(seed):
    g = fresh_generator(seed)
    with pytest.raises(RuntimeError, match="boom"), samebits.batch_invariant(), samebits.batch_invariant():
        raise RuntimeError("boom")
    assert not active()
    x, w = rand((7, 128), torch.float32, g), rand((128, 64), torch.float32, g)
    # Stock mm is back: it equals a plain torch.mm.out call, the kernel beneath the override.
    assert torch.equal(x @ w, torch.mm(x, w, out=torch.empty(7, 64)))


def test_outer_foreign_registration_survives():
    # Someone else's override of aten::mm is restored, not removed, when our block ends.
    calls = []
    lib = torch.library.Library("aten", "IMPL")
    try:
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            lib.impl("mm", lambda a, b: calls.append(1) or torch.mm(a, b, out=a.new_empty(a.shape[0], b.shape[1])),
                     "CPU")
        x = torch.ones(2, 3)
        with samebits.batch_invariant():
            x @ x.t()
        assert not calls
        x @ x.t()
        assert calls, "the outer override was torn down"
    finally:
        lib._destroy()
