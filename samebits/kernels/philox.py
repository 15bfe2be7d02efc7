"""Philox-4x32-10 in integer tensor arithmetic: the torch reference of the Triton kernel (triton/philox.py) and the
backend on the CPU.

Every draw is a pure function of (seed, sample_index, position, vocab index). Integer multiply, add, xor and shift are
exact on every backend, which is what makes CPU and CUDA agree bit for bit; no floating point enters until the final,
exact, conversion.

Counter layout for one Philox call: (c0, c1, c2, c3) = (vocab_index // 4, position, sample_index, stream) under the
key (seed low 32 bits, seed high 32 bits). The four output words cover vocab indices 4*c0 .. 4*c0 + 3, so the uniform
of a token does not depend on the vocabulary size either.
"""
from __future__ import annotations

import torch

from samebits.kernels.configs import TILE_CONFIGS

_CFG = TILE_CONFIGS["philox"]["config"]
MASK32 = 0xFFFFFFFF
PHILOX_M0 = 0xD2511F53
PHILOX_M1 = 0xCD9E8D57
PHILOX_W0 = 0x9E3779B9
PHILOX_W1 = 0xBB67AE85
PHILOX_ROUNDS = _CFG["rounds"]
UNIFORM_BITS = _CFG["uniform_bits"]


def _mulhilo(a: torch.Tensor, m: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(high, low) 32-bit halves of a * m for a in [0, 2^32) and a 32-bit constant m, without int64 overflow.

    The full product needs 64 unsigned bits, beyond signed int64; splitting m into 16-bit halves keeps every partial
    product below 2^48. In-place steps only touch fresh temporaries (the caller's `a` is never written).
    """
    p_lo = a * (m & 0xFFFF)
    p_hi = a * (m >> 16)
    low = torch.bitwise_and(p_hi, 0xFFFF).bitwise_left_shift_(16).add_(p_lo)  # < 2^49
    hi = p_hi.bitwise_right_shift_(16).add_(low >> 32)  # < 2^32: the product is below 2^64
    return hi, low.bitwise_and_(MASK32)


def _covers(big: torch.Size, small: torch.Size) -> bool:
    """Whether `small` broadcasts into `big` without growing it (torch.broadcast_shapes costs a slow first import)."""
    return len(small) <= len(big) and all(s in (1, b) for s, b in zip(reversed(small), reversed(big)))


def _xor3(fresh: torch.Tensor, a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """fresh ^ a ^ b, in place when `fresh` (a temporary) already has the broadcast shape."""
    if _covers(fresh.shape, a.shape) and _covers(fresh.shape, b.shape):
        return fresh.bitwise_xor_(a).bitwise_xor_(b)
    return fresh ^ a ^ b


def philox4x32_10(c0, c1, c2, c3, k0, k1) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """Philox-4x32-10 on int64 tensors holding 32-bit values; all arguments broadcast together."""
    k0 = torch.as_tensor(k0, dtype=torch.int64, device=c0.device)
    k1 = torch.as_tensor(k1, dtype=torch.int64, device=c0.device)
    for r in range(PHILOX_ROUNDS):
        if r:
            k0 = (k0 + PHILOX_W0) & MASK32
            k1 = (k1 + PHILOX_W1) & MASK32
        hi0, lo0 = _mulhilo(c0, PHILOX_M0)
        hi1, lo1 = _mulhilo(c2, PHILOX_M1)
        c0, c1, c2, c3 = _xor3(hi1, c1, k0), lo1, _xor3(hi0, c3, k1), lo0
    return c0, c1, c2, c3


def random_words(seeds, sample_indices, positions, vocab_size: int, stream: int) -> torch.Tensor:
    """[B, vocab_size] int64 holding 32-bit Philox words; seeds, sample_indices, positions int64 [B] on one device."""
    device = seeds.device
    n_blocks = (vocab_size + 3) // 4
    c0 = torch.arange(n_blocks, dtype=torch.int64, device=device)[None, :]
    c1 = positions[:, None]
    c2 = sample_indices[:, None]
    c3 = torch.full_like(c1, stream & MASK32)
    k0 = (seeds & MASK32)[:, None]
    k1 = ((seeds >> 32) & MASK32)[:, None]
    words = philox4x32_10(c0, c1, c2, c3, k0, k1)
    # Interleave so vocab index v reads word v % 4 of block v // 4.
    return torch.stack(words, dim=-1).reshape(seeds.shape[0], n_blocks * 4)[:, :vocab_size]


def words_to_uniforms(words: torch.Tensor) -> torch.Tensor:
    """float32 in (0, 1) from the top 24 bits of each word: k * 2^-24 is exact in float32.

    k = 0 maps to 2^-25 rather than 0 so that -log(u) stays finite; it costs a bias of 2^-49 in the mean.
    """
    k = (words >> (32 - UNIFORM_BITS)).to(torch.float32)
    return torch.where(k == 0, torch.full_like(k, 0.5), k) * (2.0 ** -UNIFORM_BITS)


def philox_uniforms(seeds, sample_indices, positions, vocab_size: int, stream: int) -> torch.Tensor:
    """[B, vocab_size] float32 uniforms (the op of the CPU backends)."""
    return words_to_uniforms(random_words(seeds, sample_indices, positions, vocab_size, stream))
