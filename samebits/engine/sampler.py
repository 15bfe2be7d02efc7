"""The sampler: each row's token and logprobs are a function of that row's logits, parameters and key alone.

Row-locality is kept by construction: every step is elementwise, a per-row sort, a per-row max/argmax (exact, order
free), a normalisation through `ops.softmax`/`ops.log_softmax` (batch invariant by the kernels' contract), or the
fixed-order prefix sum below. Parameters that are off for a row (top_k <= 0, top_p = 1, min_p = 0) give thresholds
that mask nothing, so a row gets the same bits whether or not its neighbours switched a stage on.

The draw is the exponential race: token = argmax_i p_i / E_i with E_i = -log(u_i) ~ Exp(1), u_i the counter uniforms.
It is evaluated in log space, argmax_i (z_i - log E_i) with z the filtered, temperature-scaled logits: the same argmax
(log p_i = z_i - logsumexp(z), a per-row constant), but needing no normalisation at all and no exp that could
underflow tail probabilities. It is computed in float64 so the device's log can only move a key by ~1e-16 relative,
far below the spacing of float32 logits.

The 24-bit uniforms bound E_i to [6.0e-8, 17.3], so a token whose probability is below about 3.4e-9 of the most likely
token's can never win the race: at most V * 3.4e-9 of probability mass (5e-4 at V = 150k, in practice far less) is
cut from the extreme tail. Two Philox words per token would remove this at twice the RNG cost.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from samebits.engine import rng
from samebits.kernels.common import to_device

# Below this temperature logits / t overflows float32 for ordinary logits; such rows are greedy, as in vLLM.
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32, the sampled token under log_softmax(raw logits)
    top_logprob_ids: torch.Tensor  # [B, k] int64, descending logprob, ties to the lowest id
    top_logprobs: torch.Tensor  # [B, k] float32


@dataclass(frozen=True)
class SamplingBatch:
    """One batch's per-row sampling inputs, on the host, so no device sync is needed to pick code paths.

    The values are SamplingParams' (validated there, once): build it with `of`. top_k <= 0, top_p = 1 and min_p = 0
    switch a stage off. The position is that of the token being sampled, so a recomputed or replayed step draws the
    same uniforms; seeds are 64-bit, sample indices and positions 32-bit counters.
    """

    temperature: list[float]
    top_k: list[int]
    top_p: list[float]
    min_p: list[float]
    seeds: list[int]
    sample_indices: list[int]
    positions: list[int]
    num_top_logprobs: int = 0

    def __post_init__(self) -> None:
        n = len(self.temperature)
        for name in ("top_k", "top_p", "min_p", "seeds", "sample_indices", "positions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} rows")

    @classmethod
    def of(cls, params, seeds, sample_indices, positions) -> SamplingBatch:
        """From one SamplingParams per row; top-logprobs for the largest count any row asked for."""
        return cls([p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params],
                   [p.min_p for p in params], list(seeds), list(sample_indices), list(positions),
                   max((p.logprobs or 0 for p in params), default=0))

    def __len__(self) -> int:
        return len(self.temperature)

    def greedy(self) -> list[bool]:
        return [t < GREEDY_TEMPERATURE for t in self.temperature]

    def select(self, rows: list[int]) -> SamplingBatch:
        def pick(values: list) -> list:
            return [values[i] for i in rows]

        return SamplingBatch(pick(self.temperature), pick(self.top_k), pick(self.top_p), pick(self.min_p),
                             pick(self.seeds), pick(self.sample_indices), pick(self.positions), self.num_top_logprobs)


def inclusive_prefix_sum(x: torch.Tensor) -> torch.Tensor:
    """Row-wise inclusive prefix sum whose addition tree depends on the column index only (Hillis-Steele).

    torch.cumsum makes no promise about its order across devices or batch shapes; log2(V) elementwise passes do.
    """
    out = x
    shift = 1
    while shift < x.shape[-1]:
        out = torch.cat([out[..., :shift], out[..., shift:] + out[..., :-shift]], dim=-1)
        shift *= 2
    return out


def _top_k_threshold(scaled: torch.Tensor, top_k: list[int]) -> torch.Tensor:
    """[S, 1] value of each row's k-th largest logit, -inf where top-k is off; ties at the cut are all kept."""
    vocab = scaled.shape[-1]
    ks = [k if 0 < k < vocab else 0 for k in top_k]
    top = torch.topk(scaled, max(ks), dim=-1, sorted=True).values
    col = to_device([max(k, 1) - 1 for k in ks], torch.int64, scaled.device)[:, None]
    on = to_device([k > 0 for k in ks], torch.bool, scaled.device)[:, None]
    return torch.where(on, top.gather(1, col), torch.full_like(col, float("-inf"), dtype=scaled.dtype))


def _top_p_threshold(probs: torch.Tensor, top_p: list[float]) -> torch.Tensor:
    """[S, 1] smallest probability of the minimal top set whose mass reaches top_p; 0 where top-p is off.

    Tokens are kept by value (p >= threshold), so ties at the cut are all kept and no index order enters.
    """
    desc = torch.sort(probs, dim=-1, descending=True).values
    inclusive = inclusive_prefix_sum(desc.double())
    exclusive = torch.cat([torch.zeros_like(inclusive[:, :1]), inclusive[:, :-1]], dim=-1)
    p = to_device(top_p, torch.float64, probs.device)[:, None]
    n_keep = (exclusive < p).sum(dim=-1, keepdim=True).clamp_min(1)
    threshold = desc.gather(1, n_keep - 1)
    return torch.where(p < 1.0, threshold, torch.zeros_like(threshold))


def _mask_below(logits: torch.Tensor, values: torch.Tensor, threshold: torch.Tensor) -> torch.Tensor:
    return logits.masked_fill(values < threshold, float("-inf"))


def filter_logits(scaled: torch.Tensor, top_k: Sequence[int], top_p: Sequence[float], min_p: Sequence[float],
                  ops) -> torch.Tensor:
    """Temperature-scaled logits [S, V] with top-k, then top-p, then min-p applied as -inf (HF's order).

    Each stage sees the distribution renormalised over what the previous stages kept.
    """
    if any(0 < k < scaled.shape[-1] for k in top_k):
        scaled = _mask_below(scaled, scaled, _top_k_threshold(scaled, list(top_k)))
    if any(p < 1.0 for p in top_p):
        probs = ops.softmax(scaled, dim=-1)
        scaled = _mask_below(scaled, probs, _top_p_threshold(probs, list(top_p)))
    if any(m > 0.0 for m in min_p):
        probs = ops.softmax(scaled, dim=-1)
        m = to_device(min_p, torch.float32, scaled.device)[:, None]
        # min_p = 0 gives threshold 0, which masks nothing.
        scaled = _mask_below(scaled, probs, m * probs.amax(dim=-1, keepdim=True))
    return scaled


def gumbel_noise(seeds, sample_indices, positions, vocab_size: int, device) -> torch.Tensor:
    """[S, V] float64 -log(E_i), E_i = -log(u_i): the race's keys in log space."""
    g = rng.uniforms(seeds, sample_indices, positions, vocab_size, device=device).double()
    return g.log_().neg_().log_().neg_()


def _race(filtered: torch.Tensor, seeds, sample_indices, positions) -> torch.Tensor:
    keys = filtered.double() + gumbel_noise(seeds, sample_indices, positions, filtered.shape[-1], filtered.device)
    # argmax returns the first maximum on every backend: a tie goes to the lowest token id.
    return keys.argmax(dim=-1)


def _top_logprobs(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if k <= 0:
        empty = logprobs.new_empty((logprobs.shape[0], 0))
        return empty.long(), empty
    # A stable sort orders ties by token id, which torch.topk does not promise.
    values, ids = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    return ids[:, :k], values[:, :k]


@torch.no_grad()
def sample(logits: torch.Tensor, batch: SamplingBatch, *, ops) -> SamplerOutput:
    """Sample one token per row of `logits` [B, V] float32 under `batch`'s row B parameters.

    temperature < 1e-5 is greedy (argmax of the raw logits, ties to the lowest id).
    `ops` supplies the batch-invariant `softmax` and `log_softmax` (samebits.kernels.get_ops).
    """
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be [B, V] float32, got {tuple(logits.shape)} {logits.dtype}")
    if len(batch) != logits.shape[0]:
        raise ValueError(f"the sampling batch has {len(batch)} rows for {logits.shape[0]} rows of logits")
    greedy = batch.greedy()
    tokens = logits.argmax(dim=-1)
    rows = [i for i in range(len(batch)) if not greedy[i]]
    if rows:
        tokens = tokens.index_copy(0, to_device(rows, torch.int64, logits.device),
                                   _sample_rows(logits, rows, batch.select(rows), ops))
    logprobs = ops.log_softmax(logits, dim=-1)
    ids, values = _top_logprobs(logprobs, batch.num_top_logprobs)
    return SamplerOutput(tokens, logprobs.gather(1, tokens[:, None])[:, 0], ids, values)


def _sample_rows(logits, rows: list[int], sub: SamplingBatch, ops) -> torch.Tensor:
    """The random path for the non-greedy `rows`; a row's result does not depend on which other rows are here."""
    picked = logits.index_select(0, to_device(rows, torch.int64, logits.device))
    t = to_device(sub.temperature, torch.float32, logits.device)[:, None]
    filtered = filter_logits(picked / t, sub.top_k, sub.top_p, sub.min_p, ops)
    return _race(filtered, sub.seeds, sub.sample_indices, sub.positions)


class Sampler:
    """`sample` bound to one `ops` registry."""

    def __init__(self, ops):
        self.ops = ops

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        return sample(logits, batch, ops=self.ops)
