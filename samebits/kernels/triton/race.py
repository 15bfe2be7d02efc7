"""The exponential race in one pass over the logits (torch reference: samebits/kernels/race.py).

The unfused race writes the uniforms, widens them and the logits to float64 and takes four elementwise passes and an
argmax over [S, V] float64: about 3.5 GB of memory traffic at 256 rows of a 128k vocabulary. Here each program draws
the Philox words of one chunk of one row in registers (triton/philox.py's rounds), forms the float64 keys exactly as
the reference writes them and keeps the best (key, token id) per lane; a second kernel merges a row's chunk winners.
Both merges are exact (a maximum, ties to the lowest id, NaN above everything as torch.argmax), so the chunking
cannot change a token.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from samebits.kernels.configs import TILE_CONFIGS
from samebits.kernels.triton.philox import _philox_words, _uniform, check_counters, seed_halves

_CFG = TILE_CONFIGS["gumbel_race"]["config"]
VOCAB_CHUNK = _CFG["vocab_chunk"]
BLOCK = _CFG["block"]
NO_ID = tl.constexpr(2**62)  # above every token id: loses every tie


@triton.jit
def _pick(k, i, bk, bi):
    # (k, i) beats (bk, bi): a larger key, or an equal key at a lower id; NaN is above every number (torch.argmax)
    k_nan, bk_nan = k != k, bk != bk  # noqa: PLR0124 - the NaN test
    same = (k == bk) | (k_nan & bk_nan)
    wins = (k_nan & ~bk_nan) | (k > bk) | (same & (i < bi))
    return tl.where(wins, k, bk), tl.where(wins, i, bi)


@triton.jit
def _lane_key(row, v, V, word):
    # the reference's key for vocab entry v: float32 uniform widened, -log(-log(u)), plus the widened logit
    z = tl.load(row + v, mask=v < V, other=float("-inf")).to(tl.float64)
    u = _uniform(word).to(tl.float64)
    return z + -tl.log(-tl.log(u))


@triton.jit
def _gumbel_race_kernel(Z, KEYS, IDS, SEED_LO, SEED_HI, POS, SAMPLE, V, stride_z, n_chunks, STREAM: tl.constexpr,
                        VOCAB_CHUNK: tl.constexpr, BLOCK: tl.constexpr):
    # grid (S, n_chunks); KEYS/IDS [S, n_chunks]: the best (key, id) of row b's vocabulary chunk c
    b, c = tl.program_id(0), tl.program_id(1)
    row = Z + b.to(tl.int64) * stride_z
    best_k = tl.full([BLOCK], float("-inf"), tl.float64)
    best_i = tl.full([BLOCK], NO_ID, tl.int64)
    for step in range(VOCAB_CHUNK // (4 * BLOCK)):
        blocks = c * (VOCAB_CHUNK // 4) + step * BLOCK + tl.arange(0, BLOCK)
        w0, w1, w2, w3 = _philox_words(blocks, b, SEED_LO, SEED_HI, POS, SAMPLE, STREAM)
        v = blocks.to(tl.int64) * 4
        best_k, best_i = _pick(_lane_key(row, v, V, w0), v, best_k, best_i)
        best_k, best_i = _pick(_lane_key(row, v + 1, V, w1), v + 1, best_k, best_i)
        best_k, best_i = _pick(_lane_key(row, v + 2, V, w2), v + 2, best_k, best_i)
        best_k, best_i = _pick(_lane_key(row, v + 3, V, w3), v + 3, best_k, best_i)
    best_i = tl.where(best_i < V, best_i, NO_ID)  # a lane past the vocabulary holds -inf at a phantom id
    k, i = tl.reduce((best_k, best_i), 0, _pick)
    tl.store(KEYS + b * n_chunks + c, k)
    tl.store(IDS + b * n_chunks + c, i)


@triton.jit
def _merge_chunks_kernel(KEYS, IDS, TOKENS, BEST, n_chunks, CHUNKS: tl.constexpr):
    # grid (S,): row b's winner over its chunks' winners
    b = tl.program_id(0)
    c = tl.arange(0, CHUNKS)
    k = tl.load(KEYS + b * n_chunks + c, mask=c < n_chunks, other=float("-inf"))
    i = tl.load(IDS + b * n_chunks + c, mask=c < n_chunks, other=NO_ID)
    k, i = tl.reduce((k, i), 0, _pick)
    tl.store(TOKENS + b, tl.where(i == NO_ID, 0, i))  # a row of -inf only: argmax's 0
    tl.store(BEST + b, k)


def gumbel_race(z: torch.Tensor, seeds: torch.Tensor, sample_indices: torch.Tensor, positions: torch.Tensor,
                stream: int) -> tuple[torch.Tensor, torch.Tensor]:
    """-> (token int64 [S], its key float64 [S]) for z [S, V] float32 and int64 [S] counters on z's device."""
    assert z.dim() == 2 and z.dtype == torch.float32, f"gumbel_race: z must be [S, V] float32, got " \
                                                      f"{tuple(z.shape)} {z.dtype}"
    assert z.stride(1) == 1, "gumbel_race: z's rows must be contiguous"
    check_counters("gumbel_race", seeds, sample_indices, positions)
    assert seeds.shape[0] == z.shape[0] and seeds.device == z.device, \
        f"gumbel_race: {seeds.shape[0]} counters on {seeds.device} for {z.shape[0]} rows on {z.device}"
    assert z.shape[1] >= 1 and 0 <= stream < 2**32, f"gumbel_race: vocab {z.shape[1]}, stream {stream}"
    s, vocab = z.shape
    tokens = torch.zeros(s, dtype=torch.int64, device=z.device)
    best = torch.empty(s, dtype=torch.float64, device=z.device)
    if s == 0:
        return tokens, best
    n_chunks = triton.cdiv(vocab, VOCAB_CHUNK)
    keys = torch.empty(s, n_chunks, dtype=torch.float64, device=z.device)
    ids = torch.empty(s, n_chunks, dtype=torch.int64, device=z.device)
    lo, hi = seed_halves(seeds)
    _gumbel_race_kernel[(s, n_chunks)](z, keys, ids, lo, hi, positions, sample_indices, vocab, z.stride(0), n_chunks,
                                       STREAM=stream, VOCAB_CHUNK=VOCAB_CHUNK, BLOCK=BLOCK)
    _merge_chunks_kernel[(s,)](keys, ids, tokens, best, n_chunks, CHUNKS=triton.next_power_of_2(n_chunks))
    return tokens, best
