"""Philox-4x32-10 uniforms on the GPU in one pass (the torch reference, samebits.kernels.philox, takes ~200 int64
passes).

Same counter layout and key as the reference: (c0, c1, c2, c3) = (vocab_index // 4, position, sample_index, stream),
key = (seed low 32 bits, seed high 32 bits); integer arithmetic, so the bits equal the CPU's exactly.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels.configs import TILE_CONFIGS

_CFG = TILE_CONFIGS["philox"]["config"]
BLOCK = _CFG["block"]


@triton.jit
def _u32(value, like):
    return tl.full(like.shape, value, tl.uint32)


@triton.jit
def _uniform(word):
    # top 24 bits -> k * 2^-24 in (0, 1); k == 0 maps to 2^-25 so -log(u) stays finite
    k = (word >> 8).to(tl.float32)
    return tl.where(k == 0.0, 0.5, k) * 5.9604644775390625e-08


@triton.jit
def _philox_words(blocks, b, SEED_LO, SEED_HI, POS, SAMPLE, STREAM: tl.constexpr):
    # Philox-4x32-10 of counters (blocks, POS[b], SAMPLE[b], STREAM) under key (SEED_LO[b], SEED_HI[b]): the 4 words
    # of vocab entries 4 * blocks + 0..3
    c0 = blocks.to(tl.uint32)
    c1 = _u32(0, c0) + tl.load(POS + b).to(tl.uint32)
    c2 = _u32(0, c0) + tl.load(SAMPLE + b).to(tl.uint32)
    c3 = _u32(STREAM, c0)
    k0 = _u32(0, c0) + tl.load(SEED_LO + b).to(tl.uint32)
    k1 = _u32(0, c0) + tl.load(SEED_HI + b).to(tl.uint32)
    for r in tl.static_range(10):
        if r > 0:
            k0 = k0 + _u32(0x9E3779B9, c0)
            k1 = k1 + _u32(0xBB67AE85, c0)
        m0, m1 = _u32(0xD2511F53, c0), _u32(0xCD9E8D57, c0)
        hi0, lo0 = tl.umulhi(c0, m0), c0 * m0
        hi1, lo1 = tl.umulhi(c2, m1), c2 * m1
        c0, c1, c2, c3 = hi1 ^ c1 ^ k0, lo1, hi0 ^ c3 ^ k1, lo0
    return c0, c1, c2, c3


@triton.jit
def _philox_uniform_kernel(OUT, SEED_LO, SEED_HI, POS, SAMPLE, V, stride_ob, STREAM: tl.constexpr,
                           BLOCK: tl.constexpr):
    # grid (B, cdiv(V / 4, BLOCK)); OUT [B, V] float32; one program: BLOCK Philox calls = 4 * BLOCK vocab entries
    b = tl.program_id(0)
    blocks = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)  # [BLOCK] c0
    c0, c1, c2, c3 = _philox_words(blocks, b, SEED_LO, SEED_HI, POS, SAMPLE, STREAM)
    row = OUT + b.to(tl.int64) * stride_ob
    v = blocks.to(tl.int64) * 4
    tl.store(row + v, _uniform(c0), mask=v < V)
    tl.store(row + v + 1, _uniform(c1), mask=v + 1 < V)
    tl.store(row + v + 2, _uniform(c2), mask=v + 2 < V)
    tl.store(row + v + 3, _uniform(c3), mask=v + 3 < V)


def check_counters(where: str, seeds: torch.Tensor, sample_indices: torch.Tensor, positions: torch.Tensor) -> None:
    b = seeds.shape[0]
    for name, t in (("seeds", seeds), ("sample_indices", sample_indices), ("positions", positions)):
        assert t.shape == (b,) and t.dtype == torch.int64, f"{where}: {name} must be int64 [{b}], got " \
                                                            f"{t.dtype} {tuple(t.shape)}"
        assert t.device == seeds.device, f"{where}: {name} on {t.device}, seeds on {seeds.device}"


def seed_halves(seeds: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return seeds & 0xFFFFFFFF, (seeds >> 32) & 0xFFFFFFFF


def philox_uniforms(seeds: torch.Tensor, sample_indices: torch.Tensor, positions: torch.Tensor, vocab_size: int,
                    stream: int = 0) -> torch.Tensor:
    """[B, vocab_size] float32 uniforms; seeds int64 (two's-complement 64-bit), indices int64 in [0, 2^32)."""
    b = seeds.shape[0]
    check_counters("philox_uniforms", seeds, sample_indices, positions)
    assert vocab_size >= 1 and 0 <= stream < 2**32, f"philox_uniforms: vocab_size {vocab_size}, stream {stream}"
    out = torch.empty(b, vocab_size, dtype=torch.float32, device=seeds.device)
    if b == 0:
        return out
    lo, hi = seed_halves(seeds)
    grid = (b, triton.cdiv(triton.cdiv(vocab_size, 4), BLOCK))
    _philox_uniform_kernel[grid](out, lo, hi, positions, sample_indices, vocab_size, out.stride(0), STREAM=stream,
                                 BLOCK=BLOCK)
    return out
