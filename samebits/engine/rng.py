"""Counter-based random numbers for sampling: Philox-4x32-10 (the arithmetic: samebits/kernels/philox.py).

Every draw is a pure function of (seed, sample_index, position, vocab index), so a request's randomness never depends
on its batch, its neighbours, the step it ran in or the device: the kernels compute it in integer arithmetic, exact on
every backend (the Triton kernel on CUDA, the torch reference elsewhere, bit for bit alike). This module turns a
request's seeds and counters into the kernels' int64 tensors and checks their ranges.
"""
from __future__ import annotations

import torch

from samebits.kernels import gumbel_race, philox_uniforms
from samebits.kernels.common import to_device
from samebits.kernels.philox import MASK32, philox4x32_10, words_to_uniforms
from samebits.kernels.philox import random_words as _random_words

# Stream tags (counter word c3) keep independent uses of one (seed, sample_index, position) apart.
STREAM_SAMPLE = 0


def seed_tensor(seeds, device=None) -> torch.Tensor:
    """64-bit seeds as int64 with the same two's-complement bits.

    Accepts an int64 tensor or ints in [0, 2^64); negative ints down to -2^63 are read as int64 bit patterns, so a
    tensor's `.tolist()` round-trips.
    """
    if isinstance(seeds, torch.Tensor):
        return seeds.to(device=device, dtype=torch.int64)
    wrapped = []
    for s in seeds:
        s = int(s)
        if not -(1 << 63) <= s < 1 << 64:
            raise ValueError(f"seed {s} outside [-2^63, 2^64)")
        wrapped.append(s - (1 << 64) if s >= 1 << 63 else s)
    return to_device(wrapped, torch.int64, device)


def _index_tensor(values, name: str, device) -> torch.Tensor:
    # Out-of-range counters would silently alias others; checked on the host only, to keep device steps sync-free.
    if isinstance(values, torch.Tensor):
        if values.device.type == "cpu":
            _check_counters(values.tolist(), name)
        return values.to(device=device, dtype=torch.int64)
    values = [int(v) for v in values]
    _check_counters(values, name)
    return to_device(values, torch.int64, device)


def _check_counters(values: list[int], name: str) -> None:
    if values and (min(values) < 0 or max(values) > MASK32):
        raise ValueError(f"{name} must lie in [0, 2^32)")


def _counters(seeds, sample_indices, positions, device):
    keys = seed_tensor(seeds, device)
    return (keys, _index_tensor(sample_indices, "sample_indices", keys.device),
            _index_tensor(positions, "positions", keys.device))


def random_words(seeds, sample_indices, positions, vocab_size: int, stream: int = STREAM_SAMPLE,
                 device=None) -> torch.Tensor:
    """[B, vocab_size] int64 holding 32-bit Philox words; row b is keyed by (seeds[b], sample_indices[b], positions[b])."""
    return _random_words(*_counters(seeds, sample_indices, positions, device), vocab_size, stream)


def uniforms(seeds, sample_indices, positions, vocab_size: int, stream: int = STREAM_SAMPLE,
             device=None) -> torch.Tensor:
    """[B, vocab_size] float32 uniforms in (0, 1), a pure function of each row's key and the column index."""
    return philox_uniforms(*_counters(seeds, sample_indices, positions, device), vocab_size, stream)


def race(z: torch.Tensor, seeds, sample_indices, positions, stream: int = STREAM_SAMPLE) -> torch.Tensor:
    """[S] int64: each row's winner of the exponential race over z [S, V] float32 (kernels/race.py), keyed by its
    counters; on z's device, ties to the lowest token id."""
    return gumbel_race(z, *_counters(seeds, sample_indices, positions, z.device), stream)[0]


__all__ = ["STREAM_SAMPLE", "philox4x32_10", "race", "random_words", "seed_tensor", "uniforms", "words_to_uniforms"]
