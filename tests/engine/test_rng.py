import pytest
import torch

from samebits.engine import rng
from samebits.probe.compare import assert_same_bits

M32 = 0xFFFFFFFF

# Random123 kat_vectors for philox4x32_10: (counter, key, expected output).
KAT = [
    ((0, 0, 0, 0), (0, 0), (0x6627E8D5, 0xE169C58D, 0xBC57AC4C, 0x9B00DBD8)),
    ((M32,) * 4, (M32, M32), (0x408F276D, 0x41C83B0E, 0xA20BC7C6, 0x6D5451FD)),
    ((0x243F6A88, 0x85A308D3, 0x13198A2E, 0x03707344), (0xA4093822, 0x299F31D0),
     (0xD16CFE09, 0x94FDCCEB, 0x5001E420, 0x24126EA1)),
]


def ref_philox(ctr, key):
    """Philox-4x32-10 on Python ints, written straight from the Random123 definition."""
    c, k = list(ctr), list(key)
    for r in range(10):
        if r:
            k = [(k[0] + 0x9E3779B9) & M32, (k[1] + 0xBB67AE85) & M32]
        p0, p1 = 0xD2511F53 * c[0], 0xCD9E8D57 * c[2]
        c = [((p1 >> 32) ^ c[1] ^ k[0]) & M32, p1 & M32, ((p0 >> 32) ^ c[3] ^ k[1]) & M32, p0 & M32]
    return c


def ref_uniform(seed, sample_index, position, v):
    word = ref_philox((v // 4, position, sample_index, 0), (seed & M32, seed >> 32))[v % 4]
    k = word >> 8
    return (k if k else 0.5) * 2.0**-24


@pytest.mark.parametrize("ctr,key,expected", KAT)
def test_known_answers(ctr, key, expected):
    assert tuple(ref_philox(ctr, key)) == expected
    got = rng.philox4x32_10(*(torch.tensor([c]) for c in ctr), *key)
    assert tuple(int(w) for w in got) == expected


def test_vectorised_philox_matches_reference_on_random_counters():
    g = torch.Generator().manual_seed(0)
    ctr = torch.randint(0, 1 << 32, (4, 256), generator=g, dtype=torch.int64)
    key = torch.randint(0, 1 << 32, (2, 256), generator=g, dtype=torch.int64)
    got = torch.stack(rng.philox4x32_10(*ctr, *key))
    want = [ref_philox(ctr[:, i].tolist(), key[:, i].tolist()) for i in range(256)]
    assert_same_bits(got, torch.tensor(want, dtype=torch.int64).T, "philox words")


def test_uniforms_equal_pure_python_reference():
    seeds = [0, 1, 0xDEADBEEF, (1 << 64) - 1, 1 << 63, 0x0123456789ABCDEF]
    sample_indices = [0, 3, 1, 0, 7, 2]
    positions = [0, 17, 4095, M32, 1, 123456]
    vocab = 37  # not a multiple of 4: the last block is cut
    got = rng.uniforms(seeds, sample_indices, positions, vocab)
    want = torch.tensor([[ref_uniform(s, i, p, v) for v in range(vocab)]
                         for s, i, p in zip(seeds, sample_indices, positions)], dtype=torch.float32)
    assert got.dtype == torch.float32
    assert_same_bits(got, want, "uniforms")


def test_uniform_of_a_token_does_not_depend_on_vocab_size_or_batch():
    full = rng.uniforms([5, 6, 7], [0, 1, 2], [10, 11, 12], 1003)
    assert_same_bits(rng.uniforms([6], [1], [11], 101), full[1:2, :101], "vocab prefix")


def test_uniforms_open_interval_and_flat():
    u = rng.uniforms(list(range(16)), [0] * 16, list(range(16)), 4096).double()
    assert float(u.min()) > 0.0 and float(u.max()) < 1.0
    counts = torch.histc(u, bins=64, min=0.0, max=1.0)
    expected = u.numel() / 64
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    p_value = float(torch.special.gammaincc(torch.tensor(63 / 2), torch.tensor(chi2 / 2)))
    assert p_value > 1e-4, chi2


def test_zero_word_maps_inside_the_interval():
    u = rng.words_to_uniforms(torch.tensor([0, 0xFF, 0x100, M32]))
    assert u.tolist() == [2.0**-25, 2.0**-25, 2.0**-24, 1 - 2.0**-24]


def test_each_key_part_changes_the_draw():
    base = rng.random_words([42], [0], [9], 64)
    for words in (rng.random_words([43], [0], [9], 64), rng.random_words([42], [1], [9], 64),
                  rng.random_words([42], [0], [10], 64), rng.random_words([42 + (1 << 32)], [0], [9], 64),
                  rng.random_words([42], [0], [9], 64, stream=1)):
        # 64 independent 32-bit words colliding by chance: probability about 64 * 2^-32.
        assert int((words == base).sum()) == 0


def test_rejects_out_of_range_keys():
    with pytest.raises(ValueError):
        rng.uniforms([1 << 64], [0], [0], 4)
    with pytest.raises(ValueError):
        rng.uniforms([1], [-1], [0], 4)
    with pytest.raises(ValueError):
        rng.uniforms([1], [0], [1 << 32], 4)


def test_seed_tensor_keeps_64_bits():
    seeds = rng.seed_tensor([(1 << 64) - 1, 1 << 63, 5])
    assert seeds.tolist() == [-1, -(1 << 63), 5]
    assert_same_bits(rng.uniforms(seeds, [0] * 3, [0] * 3, 8), rng.uniforms([(1 << 64) - 1, 1 << 63, 5], [0] * 3,
                                                                              [0] * 3, 8))


@pytest.mark.gpu
def test_cuda_uniforms_equal_cpu():
    g = torch.Generator().manual_seed(1)
    seeds = torch.randint(-(1 << 63), (1 << 63) - 1, (96,), generator=g, dtype=torch.int64)
    sample_indices = torch.randint(0, 8, (96,), generator=g)
    positions = torch.randint(0, 1 << 20, (96,), generator=g)
    cpu = rng.uniforms(seeds, sample_indices, positions, 151_936)
    cuda = rng.uniforms(seeds.cuda(), sample_indices.cuda(), positions.cuda(), 151_936)
    assert cuda.is_cuda
    assert_same_bits(cuda, cpu, "uniforms cuda vs cpu")
