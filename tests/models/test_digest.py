"""The weights digest: exact integer chunk sums (no overflow, any order), and a digest that names the bits."""
import numpy as np
import pytest
import torch

from samebits.models import digest
from samebits.models.digest import CHUNK_WORDS, chunk_sums, position_weights, weights_digest, words


def tensors(seed: int) -> list[tuple[str, torch.Tensor]]:
    gen = torch.Generator().manual_seed(seed)
    return [("b.weight", torch.randn(64, 48, generator=gen)), ("a.norm", torch.randn(48, generator=gen).bfloat16()),
            ("c.empty", torch.zeros(0)), ("d.codes", torch.randint(0, 256, (9,), generator=gen, dtype=torch.uint8))]


def exact_sums(run: torch.Tensor, chunk: int) -> list[int]:
    """Python integers, one chunk at a time: the mathematical value the device sums must equal."""
    values, w = run.tolist(), position_weights(chunk, "cpu").tolist()
    return [sum(v * w[j] for j, v in enumerate(values[s:s + chunk])) for s in range(0, len(values), chunk)]


def test_chunk_sums_are_the_exact_integers(monkeypatch, seed):
    monkeypatch.setattr(digest, "CHUNK_WORDS", 1000)
    run = words(torch.randn(2500, generator=torch.Generator().manual_seed(seed)))
    assert chunk_sums(run, position_weights(1000, "cpu")).tolist() == exact_sums(run, 1000)


def test_a_full_chunk_of_extreme_words_does_not_overflow():
    run = torch.full((CHUNK_WORDS,), -(1 << 15), dtype=torch.int16)
    weights = position_weights(CHUNK_WORDS, "cpu")
    assert int(weights.min()) >= 1 and int(weights.max()) <= 1 << 15
    assert chunk_sums(run, weights).tolist() == [-(1 << 15) * int(weights.sum(dtype=torch.int64))]


def test_digest_is_the_same_at_any_thread_count_and_tensor_order(seed):
    threads = torch.get_num_threads()
    try:
        torch.set_num_threads(1)
        one = weights_digest(tensors(seed))
    finally:
        torch.set_num_threads(threads)
    assert weights_digest(reversed(tensors(seed))) == one


def test_negative_control_a_float_sum_of_the_same_products_depends_on_the_order(seed):
    """Why integers: the same weighted words summed in three orders agree as int64 and do not all agree as float32
    (two orders alone happened to round alike for about 1 seed in 300)."""
    gen = torch.Generator().manual_seed(seed)
    run = words(torch.randn(1 << 16, generator=gen))
    products = run * position_weights(run.numel(), "cpu")
    orders = [products, products.flip(0), products[torch.randperm(products.numel(), generator=gen)]]
    assert len({int(p.cumsum(0, dtype=torch.int64)[-1]) for p in orders}) == 1
    sums = {int(np.cumsum(p.float().numpy(), dtype=np.float32)[-1].view(np.int32)) for p in orders}
    assert len(sums) > 1, f"three orders gave one float32 sum {sums}"


@pytest.mark.parametrize("change", ["one ulp", "swap two elements", "rename", "same bits as another dtype",
                                    "reshape"])
def test_any_change_to_the_bits_or_their_description_changes_the_digest(change, seed):
    base = tensors(seed)
    name, t = base[0]
    changed = {
        "one ulp": (name, t.clone().index_put_((torch.tensor([5]), torch.tensor([7])),
                                               t[5, 7].nextafter(torch.tensor(float("inf"))))),
        "swap two elements": (name, t.clone().index_put_((torch.tensor([0, 1]), torch.tensor([0, 0])),
                                                         t[[1, 0], [0, 0]])),
        "rename": ("b.weight2", t),
        "same bits as another dtype": (name, t.view(torch.int32)),
        "reshape": (name, t.reshape(48, 64)),
    }[change]
    assert torch.equal(t, base[0][1])
    assert weights_digest([changed, *base[1:]]) != weights_digest(base)
