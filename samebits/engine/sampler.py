"""The sampler: each row's token and logprobs are a function of that row's logits, parameters and key alone.

Row-locality is kept by construction: every step is elementwise, a per-row sort, a per-row max/argmax (exact, order
free), a normalisation through `ops.softmax`/`ops.log_softmax` (batch invariant by the kernels' contract), or the
fixed-order prefix sum below. Parameters that are off for a row (top_k <= 0, top_p = 1, min_p = 0) give thresholds
that mask nothing, so a row gets the same bits whether or not its neighbours switched a stage on.

The draw is the exponential race: token = argmax_i p_i / E_i with E_i = -log(u_i) ~ Exp(1), u_i the counter uniforms.
It is evaluated in log space, argmax_i (z_i - log E_i) with z the filtered, temperature-scaled logits: the same argmax
(log p_i = z_i - logsumexp(z), a per-row constant), but needing no normalisation at all and no exp that could
underflow tail probabilities. It is computed in float64 so the device's log can only move a key by ~1e-16 relative,
far below the spacing of float32 logits; on CUDA one fused kernel draws, keys and races (kernels/race.py).

The 24-bit uniforms bound E_i to [6.0e-8, 17.3], so a token whose probability is below about 3.4e-9 of the most likely
token's can never win the race: at most V * 3.4e-9 of probability mass (5e-4 at V = 150k, in practice far less) is
cut from the extreme tail. Two Philox words per token would remove this at twice the RNG cost.

Before the draw, `adjust_logits` applies what a row's parameters change in its own logits, in vLLM's order and with
its formulas: allowed_token_ids, min_tokens (the row's stop ids and eos masked until it has that many tokens),
logit_bias, then the repetition (prompt and generated tokens), frequency and presence (generated tokens) penalties.
Every step is elementwise on the row, with counts made on the host (exact integers, no atomics) and written by unique
index, so the mode changes nothing there; only the rows that adjust are touched, and a batch where no row adjusts
runs none of it. Then a row whose request has a grammar gets its own mask of allowed tokens (structured/masks.py),
filled on the host by the row's matcher when the batch is sampled. The reported logprobs stay those of the raw logits,
as vLLM's default `raw_logprobs` names them (vLLM's grammar mask reaches its logprobs; samebits' logprobs stay equal to
teacher-forced scoring's).
"""
from __future__ import annotations

import array
import itertools
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from samebits.engine import rng
from samebits.engine.sequence import PENDING
from samebits.kernels.common import to_device
from samebits.kernels.ops import OpSet
from samebits.structured.masks import GrammarRows

# Below this temperature logits / t overflows float32 for ordinary logits; such rows are greedy, as in vLLM.
GREEDY_TEMPERATURE = 1e-5


@dataclass(frozen=True)
class SamplerOutput:
    token_ids: torch.Tensor  # [B] int64
    logprobs: torch.Tensor  # [B] float32, the sampled token under log_softmax(raw logits)
    top_logprob_ids: torch.Tensor  # [B, k] int64, descending logprob, ties to the lowest id
    top_logprobs: torch.Tensor  # [B, k] float32
    ranks: torch.Tensor | None = None  # [B] int64, the sampled token's rank (token_ranks); when a row asks for logprobs


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
    # Whether any row asks for logprobs (even 0 alternatives): the sampled tokens' ranks are computed then only.
    ranks: bool = False
    # Per row its RowAdjust or None; None for the whole batch when no row adjusts its logits.
    adjust: list[RowAdjust | None] | None = None
    # The rows with a grammar, masked before the draw (structured/masks.py); None when no row has one.
    grammar: GrammarRows | None = None

    def __post_init__(self) -> None:
        n = len(self.temperature)
        for name in ("top_k", "top_p", "min_p", "seeds", "sample_indices", "positions"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name} has {len(getattr(self, name))} entries for {n} rows")
        if self.adjust is not None and len(self.adjust) != n:
            raise ValueError(f"adjust has {len(self.adjust)} entries for {n} rows")

    @classmethod
    def of(cls, params, seeds, sample_indices, positions, histories=None, eos_token_ids=()) -> SamplingBatch:
        """From one SamplingParams per row; top-logprobs for the largest count any row asked for.

        `histories[i]` (the engine's Sequence: `token_ids`, `num_prompt_tokens`) is read only for a row whose
        parameters adjust its logits; `eos_token_ids` are what min_tokens masks besides the row's stop ids.
        """
        positions = list(positions)
        adjust = None
        if any(p.adjusts_logits for p in params):
            adjust = [RowAdjust.of(p, histories[i], positions[i], eos_token_ids) if p.adjusts_logits else None
                      for i, p in enumerate(params)]
        grammar = GrammarRows.of(histories, positions) if any(p.structured_outputs for p in params) else None
        return cls([p.temperature for p in params], [p.top_k for p in params], [p.top_p for p in params],
                   [p.min_p for p in params], list(seeds), list(sample_indices), positions,
                   max((p.logprobs or 0 for p in params), default=0), any(p.logprobs is not None for p in params),
                   adjust, grammar)

    def __len__(self) -> int:
        return len(self.temperature)

    def greedy(self) -> list[bool]:
        return [t < GREEDY_TEMPERATURE for t in self.temperature]

    def select(self, rows: list[int]) -> SamplingBatch:
        """The rows' sampling inputs, for the draw: the logits adjustments and grammar masks are already applied."""
        def pick(values: list) -> list:
            return [values[i] for i in rows]

        return SamplingBatch(pick(self.temperature), pick(self.top_k), pick(self.top_p), pick(self.min_p),
                             pick(self.seeds), pick(self.sample_indices), pick(self.positions), self.num_top_logprobs,
                             self.ranks, None if self.adjust is None else pick(self.adjust))


@dataclass(frozen=True)
class RowAdjust:
    """What one row's parameters change in its logits, with the row's history; the defaults change nothing."""

    prompt_token_ids: Sequence[int] = ()
    output_token_ids: Sequence[int] = ()
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    banned: tuple[int, ...] = ()  # masked this step: the stop ids and eos while min_tokens is not reached
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: Sequence[int] | None = None
    penalised: bool = False  # SamplingParams.has_penalties: the histories above are filled only then

    @classmethod
    def of(cls, p, history, position: int, eos_token_ids) -> RowAdjust:
        """Row `history` (token_ids, num_prompt_tokens) sampling the token at `position`; history must hold every
        token before it, or the penalties would silently count a shorter one."""
        ids, n_prompt = history.token_ids, history.num_prompt_tokens
        if len(ids) < position:
            raise ValueError(f"the row's history has {len(ids)} tokens, the sampled position is {position}")
        banned = ()
        if position - n_prompt < p.min_tokens:  # vLLM: masked while fewer than min_tokens have been generated
            banned = tuple(sorted(set(p.stop_token_ids or ()) | (set() if p.ignore_eos else set(eos_token_ids))))
        penalised = p.has_penalties
        if penalised and PENDING in ids[:position]:
            raise ValueError("a penalised row's history holds a token not yet read back (async scheduling must "
                             "read back before a penalised row is sampled)")
        return cls(ids[:n_prompt] if penalised else (), ids[n_prompt:position] if penalised else (),
                   p.presence_penalty, p.frequency_penalty, p.repetition_penalty, banned, p.logit_bias,
                   p.allowed_token_ids, penalised)


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


def teacher_forced(logits: torch.Tensor, targets: list[int], ops: OpSet) -> list[float]:
    """log_softmax(logits)[i, targets[i]] through `ops.log_softmax`, the sampler's own, so the bits decode reports."""
    logprobs = ops.log_softmax(logits, dim=-1)
    return logprobs.gather(1, torch.tensor(targets, device=logits.device)[:, None])[:, 0].tolist()


def token_ranks(logprobs: torch.Tensor, picked: torch.Tensor) -> torch.Tensor:
    """[R] int64 rank of each row's token whose logprob is `picked` [R, 1]: vLLM's count, how many tokens of the row
    are at least as likely (1 for the most likely). A count over the row alone: exact, in any order."""
    return (logprobs >= picked).sum(dim=-1)


def top_k_logprobs(logprobs: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    if k <= 0:
        empty = logprobs.new_empty((logprobs.shape[0], 0))
        return empty.long(), empty
    # A stable sort orders ties by token id, which torch.topk does not promise.
    values, ids = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    return ids[:, :k], values[:, :k]


@torch.no_grad()
def sample(logits: torch.Tensor, batch: SamplingBatch, *, ops: OpSet) -> SamplerOutput:
    """Sample one token per row of `logits` [B, V] float32 under `batch`'s row B parameters.

    temperature < 1e-5 is greedy (argmax of the raw logits, ties to the lowest id).
    `ops` supplies the batch-invariant `softmax` and `log_softmax` (samebits.kernels.get_ops).
    """
    if logits.dim() != 2 or logits.dtype != torch.float32:
        raise ValueError(f"logits must be [B, V] float32, got {tuple(logits.shape)} {logits.dtype}")
    if len(batch) != logits.shape[0]:
        raise ValueError(f"the sampling batch has {len(batch)} rows for {logits.shape[0]} rows of logits")
    greedy = batch.greedy()
    adjusted = logits if batch.adjust is None else adjust_logits(logits, batch.adjust)
    if batch.grammar is not None:
        adjusted = batch.grammar.apply(adjusted)
    rows = [i for i in range(len(batch)) if not greedy[i]]
    if len(rows) == len(batch):  # every row samples: no argmax to overwrite (a decode step's kernel fewer)
        tokens = _sample_rows(adjusted, rows, batch, ops)
    else:
        tokens = adjusted.argmax(dim=-1)
        if rows:
            tokens = tokens.index_copy(0, to_device(rows, torch.int64, logits.device),
                                       _sample_rows(adjusted, rows, batch.select(rows), ops))
    logprobs = ops.log_softmax(logits, dim=-1)
    ids, values = top_k_logprobs(logprobs, batch.num_top_logprobs)
    picked = logprobs.gather(1, tokens[:, None])
    ranks = token_ranks(logprobs, picked) if batch.ranks else None
    return SamplerOutput(tokens, picked[:, 0], ids, values, ranks)


def _sample_rows(logits, rows: list[int], sub: SamplingBatch, ops) -> torch.Tensor:
    """The random path for the non-greedy `rows`; a row's result does not depend on which other rows are here."""
    every = len(rows) == logits.shape[0]  # rows are ascending, so all of them is the identity
    picked = logits if every else logits.index_select(0, to_device(rows, torch.int64, logits.device))
    t = to_device(sub.temperature, torch.float32, logits.device)[:, None]
    filtered = filter_logits(picked / t, sub.top_k, sub.top_p, sub.min_p, ops)
    return rng.race(filtered, sub.seeds, sub.sample_indices, sub.positions)


def adjust_logits(logits: torch.Tensor, adjust: list[RowAdjust | None]) -> torch.Tensor:
    """`logits` [B, V] with each adjusting row's changes applied (vLLM's order); the other rows' bits untouched."""
    rows = [i for i, a in enumerate(adjust) if a is not None]
    index = to_device(rows, torch.int64, logits.device)
    sub = [adjust[i] for i in rows]
    x = logits.index_select(0, index)
    x = _mask_disallowed(x, sub)
    x = _mask_banned(x, sub)
    x = _add_bias(x, sub)
    if any(a.penalised for a in sub):
        x = apply_penalties(x, sub)
    return logits.index_copy(0, index, x)


def _pairs(x: torch.Tensor, per_row: list[Sequence[int]]) -> tuple[torch.Tensor, torch.Tensor]:
    """(row, column) index tensors of each row's ids (ids < V only: one outside can never be drawn)."""
    vocab = x.shape[-1]
    r = [i for i, ids in enumerate(per_row) for t in ids if t < vocab]
    c = [t for ids in per_row for t in ids if t < vocab]
    return to_device(r, torch.int64, x.device), to_device(c, torch.int64, x.device)


def _mask_disallowed(x: torch.Tensor, sub: list[RowAdjust]) -> torch.Tensor:
    on = [i for i, a in enumerate(sub) if a.allowed_token_ids is not None]
    if not on:
        return x
    keep = torch.ones_like(x, dtype=torch.bool)
    keep[to_device(on, torch.int64, x.device)] = False
    keep[_pairs(x, [a.allowed_token_ids or () for a in sub])] = True
    return x.masked_fill(~keep, float("-inf"))


def _mask_banned(x: torch.Tensor, sub: list[RowAdjust]) -> torch.Tensor:
    if not any(a.banned for a in sub):
        return x
    x = x.clone()
    x[_pairs(x, [a.banned for a in sub])] = float("-inf")
    return x


def _add_bias(x: torch.Tensor, sub: list[RowAdjust]) -> torch.Tensor:
    """x[row, t] += bias at the listed tokens only (a dict: each (row, token) once, so no accumulation order)."""
    biases = [a.logit_bias or {} for a in sub]
    if not any(biases):
        return x
    where = _pairs(x, [list(b) for b in biases])
    vocab = x.shape[-1]
    values = to_device([v for b in biases for t, v in b.items() if t < vocab], torch.float32, x.device)
    x = x.clone()
    x[where] = x[where] + values
    return x


def token_counts(x: torch.Tensor, per_row: list[Sequence[int]]) -> torch.Tensor:
    """[S, V] float32 count of each token in each row's ids: counted on the host by one sort (exact integers), then
    written by unique index, so there is no accumulation order and no device sync."""
    vocab, out = x.shape[-1], torch.zeros_like(x)
    if not any(per_row):
        return out
    # array('q') then frombuffer: a Python int list becomes a tensor ~5x faster than through torch.tensor.
    ids = torch.frombuffer(array.array("q", itertools.chain.from_iterable(per_row)), dtype=torch.int64)
    rows = torch.repeat_interleave(torch.arange(len(per_row)), torch.tensor([len(r) for r in per_row]))
    keep = ids < vocab  # an id outside the logits can never be drawn; counted, it would land in the next row
    keys, counts = torch.unique(rows[keep] * vocab + ids[keep], return_counts=True)
    out[_staged(keys // vocab, x.device), _staged(keys % vocab, x.device)] = _staged(counts.float(), x.device)
    return out


def _staged(t: torch.Tensor, device) -> torch.Tensor:
    """A host tensor on `device` without a host sync (pinned and non_blocking on CUDA, as kernels.common.to_device)."""
    return t.to(device) if device.type != "cuda" else t.pin_memory().to(device, non_blocking=True)


def apply_penalties(x: torch.Tensor, sub: list[RowAdjust]) -> torch.Tensor:
    """vLLM's penalties on [S, V] float32 logits, in its order and formulas:
    repetition (tokens in the prompt or generated): x / r where x > 0, else x * r;
    then x -= frequency * count and x -= presence * (count > 0), over generated tokens only.
    r = 1, frequency = presence = 0 are exact identities, so a row's bits do not depend on its neighbours'."""
    device = x.device
    out = token_counts(x, [a.output_token_ids for a in sub])
    seen = (token_counts(x, [a.prompt_token_ids for a in sub]) > 0) | (out > 0)
    r = to_device([a.repetition_penalty for a in sub], torch.float32, device)[:, None]
    r = torch.where(seen, r, torch.ones_like(x))
    x = torch.where(x > 0, x / r, x * r)
    freq = to_device([a.frequency_penalty for a in sub], torch.float32, device)[:, None]
    presence = to_device([a.presence_penalty for a in sub], torch.float32, device)[:, None]
    x = x - freq * out
    return x - presence * (out > 0).to(x.dtype)


class Sampler:
    """`sample` bound to one `ops` registry."""

    def __init__(self, ops: OpSet):
        self.ops = ops

    def __call__(self, logits: torch.Tensor, batch: SamplingBatch) -> SamplerOutput:
        return sample(logits, batch, ops=self.ops)
