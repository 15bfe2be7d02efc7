"""The fused Philox kernel equals its torch reference (the integer-tensor Philox of samebits.kernels.philox) bit for bit
(interpreter here, real CUDA in tests/engine/test_rng.py's GPU test, which routes through this kernel)."""
import pytest
import torch

from samebits.kernels.philox import random_words, words_to_uniforms
from samebits.kernels.triton.philox import philox_uniforms

pytestmark = pytest.mark.interpreter


@pytest.mark.parametrize("vocab", [1, 3, 4, 5, 4099, 10001])
def test_kernel_equals_integer_tensor_philox(vocab):
    g = torch.Generator().manual_seed(vocab)
    seeds = torch.randint(-2**63, 2**63 - 1, (6,), dtype=torch.int64, generator=g)
    positions = torch.randint(0, 2**32, (6,), dtype=torch.int64, generator=g)
    samples = torch.randint(0, 2**32, (6,), dtype=torch.int64, generator=g)
    got = philox_uniforms(seeds, samples, positions, vocab, stream=3)
    want = words_to_uniforms(random_words(seeds, samples, positions, vocab, stream=3))
    assert torch.equal(got, want)


def test_negative_control_a_different_stream_differs():
    seeds = torch.tensor([1, 2], dtype=torch.int64)
    idx = torch.tensor([0, 0], dtype=torch.int64)
    assert not torch.equal(philox_uniforms(seeds, idx, idx, 64, stream=0), philox_uniforms(seeds, idx, idx, 64, stream=1))


def test_launcher_names_a_wrong_dtype():
    with pytest.raises(AssertionError, match="seeds must be int64"):
        philox_uniforms(torch.zeros(2, dtype=torch.int32), torch.zeros(2, dtype=torch.int64),
                        torch.zeros(2, dtype=torch.int64), 8)
