import random
from dataclasses import dataclass, field

import pytest
import torch

from samebits.engine import sampler as S
from samebits.engine.sampling_params import SamplingParams
from samebits.kernels import get_ops
from samebits.probe.compare import assert_same_bits, mismatch

OPS = get_ops("deterministic", "cpu")
VOCAB = 640
OFF = {"temperature": 1.0, "top_k": -1, "top_p": 1.0, "min_p": 0.0}
PARAM_MENU = [
    dict(OFF, temperature=0.0),
    dict(OFF),
    dict(OFF, temperature=0.7, top_k=50),
    dict(OFF, temperature=0.8, top_p=0.9),
    dict(OFF, temperature=1.3, min_p=0.05),
    dict(OFF, temperature=0.6, top_k=200, top_p=0.95, min_p=0.02),
    dict(OFF, temperature=1.0, top_k=1),
    dict(OFF, temperature=2.0, top_p=0.5),
]
FIELDS = ("token_ids", "logprobs", "top_logprob_ids", "top_logprobs")


@dataclass
class Row:
    logits: torch.Tensor
    params: dict
    seed: int
    sample_index: int = 0
    position: int = 0
    extra: dict = field(default_factory=dict)


def random_row(rnd: random.Random, vocab=VOCAB, params=None) -> Row:
    g = torch.Generator().manual_seed(rnd.getrandbits(62))
    logits = torch.randn(vocab, generator=g) * rnd.choice([0.5, 2.0, 6.0])
    return Row(logits, params or rnd.choice(PARAM_MENU), rnd.getrandbits(64), rnd.randrange(4), rnd.randrange(1 << 20))


def run(sample_fn, rows: list[Row], k: int = 5) -> S.SamplerOutput:
    p = {name: [r.params[name] for r in rows] for name in OFF}
    return sample_fn(torch.stack([r.logits for r in rows]), S.SamplingBatch(
        p["temperature"], p["top_k"], p["top_p"], p["min_p"], [r.seed for r in rows], [r.sample_index for r in rows],
        [r.position for r in rows], k))


def ours(logits, batch):
    return S.Sampler(OPS)(logits, batch)


def alone_vs_batched(sample_fn, needle: Row, batch_sizes, rnd: random.Random) -> dict:
    """Bit mismatch, per output field, between `needle` sampled alone and at a random place in each batch."""
    alone = run(sample_fn, [needle])
    got = {f: [] for f in FIELDS}
    for n in batch_sizes:
        batch = [random_row(rnd) for _ in range(n - 1)]
        at = rnd.randrange(n)
        batch.insert(at, needle)
        out = run(sample_fn, batch)
        for f in FIELDS:
            got[f].append(getattr(out, f)[at:at + 1])
    return {f: mismatch(getattr(alone, f).expand_as(torch.cat(got[f])).contiguous(), torch.cat(got[f]))
            for f in FIELDS}


BATCH_SIZES = [1, 2, 3, 5, 8, 13, 16, 31, 32, 64, 97, 128]


@pytest.mark.parametrize("menu_index", range(len(PARAM_MENU)))
def test_row_alone_equals_row_inside_mixed_batches(menu_index, seed):
    rnd = random.Random(seed * 100 + menu_index)
    needle = random_row(rnd, params=PARAM_MENU[menu_index])
    for f, m in alone_vs_batched(ours, needle, BATCH_SIZES, rnd).items():
        assert m.same, (f, m)


def global_rng_sample(logits, batch):
    """The common mistake: one seeded global generator shared by the whole batch."""
    k = batch.num_top_logprobs
    with torch.random.fork_rng():
        torch.manual_seed(batch.seeds[0])
        t = torch.tensor([max(x, 1e-5) for x in batch.temperature])[:, None]
        tokens = torch.multinomial(torch.softmax(logits / t, dim=-1), 1)[:, 0]
    logprobs = torch.log_softmax(logits, dim=-1)
    values, ids = torch.sort(logprobs, dim=-1, descending=True, stable=True)
    return S.SamplerOutput(tokens, logprobs.gather(1, tokens[:, None])[:, 0], ids[:, :k], values[:, :k])


def test_negative_control_global_rng_is_caught_by_the_same_comparison(seed):
    rnd = random.Random(seed)
    # Flat logits: two generator states pick the same token with probability 1/VOCAB, so over the batch sizes the
    # shared generator is caught for every seed (a peaked row could draw its argmax every time and hide it).
    needle = Row(torch.zeros(VOCAB), dict(OFF), rnd.getrandbits(64), 0, 0)
    caught = alone_vs_batched(global_rng_sample, needle, BATCH_SIZES, rnd)
    assert not caught["token_ids"].same
    # ...while the comparison still finds it consistent where it should: logprobs do not involve the generator.
    assert caught["top_logprobs"].same


def test_greedy_is_argmax_with_ties_to_lowest_id():
    logits = torch.randn(4, 64, generator=torch.Generator().manual_seed(0))
    logits[1, 9] = logits[1, 40] = logits[1].max() + 1.0
    out = S.sample(logits, S.SamplingBatch([0.0] * 4, [5, -1, 0, 3], [0.5, 1.0, 0.9, 1.0], [0.0, 0.1, 0.0, 0.3],
                                           [1, 2, 3, 4], [0] * 4, [0] * 4), ops=OPS)
    assert_same_bits(out.token_ids, logits.argmax(dim=-1), "greedy tokens")
    assert int(out.token_ids[1]) == 9


def test_logprobs_are_raw_log_softmax_whatever_the_temperature(seed):
    rnd = random.Random(seed)
    rows = [random_row(rnd, params=p) for p in PARAM_MENU]
    out = run(ours, rows, k=7)
    raw = OPS.log_softmax(torch.stack([r.logits for r in rows]), dim=-1)
    assert_same_bits(out.logprobs, raw.gather(1, out.token_ids[:, None])[:, 0], "sampled logprobs")
    assert out.logprobs.dtype == torch.float32 and out.token_ids.dtype == torch.int64


def test_top_logprobs_sorted_ties_to_lowest_id_and_prefix_consistent():
    logits = torch.tensor([[0.0, 2.0, 1.0, 2.0, -1.0, 2.0]])
    out = S.sample(logits, S.SamplingBatch([1.0], [-1], [1.0], [0.0], [7], [0], [0], 4), ops=OPS)
    assert out.top_logprob_ids.tolist() == [[1, 3, 5, 2]]
    assert_same_bits(out.top_logprobs, OPS.log_softmax(logits, -1)[:, [1, 3, 5, 2]], "top logprobs")
    fewer = S.sample(logits, S.SamplingBatch([1.0], [-1], [1.0], [0.0], [7], [0], [0], 2), ops=OPS)
    assert_same_bits(fewer.top_logprob_ids, out.top_logprob_ids[:, :2], "top ids prefix")
    none = S.sample(logits, S.SamplingBatch([1.0], [-1], [1.0], [0.0], [7], [0], [0], 0), ops=OPS)
    assert none.top_logprob_ids.shape == (1, 0) and none.top_logprobs.shape == (1, 0)


def _many(logits_row, params, seeds, sample_indices, positions):
    n = len(seeds)
    batch = S.SamplingBatch([params["temperature"]] * n, [params["top_k"]] * n, [params["top_p"]] * n,
                            [params["min_p"]] * n, seeds, sample_indices, positions)
    return S.sample(logits_row.expand(n, -1).contiguous(), batch, ops=OPS).token_ids


def test_same_key_same_token_and_each_key_part_matters():
    logits = torch.randn(VOCAB, generator=torch.Generator().manual_seed(5))
    n = 256
    base = _many(logits, OFF, list(range(n)), [0] * n, [100] * n)
    assert_same_bits(_many(logits, OFF, list(range(n)), [0] * n, [100] * n), base, "replay")
    # With this flat a distribution two independent draws agree with probability sum(p^2) < 1 %.
    for other in (_many(logits, OFF, list(range(n, 2 * n)), [0] * n, [100] * n),
                  _many(logits, OFF, list(range(n)), [1] * n, [100] * n),
                  _many(logits, OFF, list(range(n)), [0] * n, [101] * n)):
        assert int((other == base).sum()) < n // 20


def _chi2_p_value(counts: torch.Tensor, probs: torch.Tensor) -> float:
    expected = probs * counts.sum()
    chi2 = float(((counts - expected) ** 2 / expected).sum())
    dof = counts.numel() - 1
    return float(torch.special.gammaincc(torch.tensor(dof / 2, dtype=torch.float64),
                                         torch.tensor(chi2 / 2, dtype=torch.float64)))


def ref_keep(scaled: torch.Tensor, top_k: int, top_p: float, min_p: float) -> torch.Tensor:
    """Straightforward per-row reference for the filters: top-k, then top-p, then min-p, each renormalised."""
    keep = torch.ones_like(scaled, dtype=torch.bool)
    vocab = scaled.numel()
    if 0 < top_k < vocab:
        keep &= scaled >= sorted(scaled.tolist(), reverse=True)[top_k - 1]
    if top_p < 1.0:
        probs = OPS.softmax(scaled.masked_fill(~keep, float("-inf"))[None], -1)[0]
        mass, cut = 0.0, None
        for p in sorted(probs.tolist(), reverse=True):
            if mass >= top_p:
                break
            cut, mass = p, mass + p
        keep &= probs >= cut
    if min_p > 0.0:
        probs = OPS.softmax(scaled.masked_fill(~keep, float("-inf"))[None], -1)[0]
        keep &= probs >= torch.tensor(min_p, dtype=torch.float32) * probs.max()
    return keep


def test_filters_match_the_reference(seed):
    rnd = random.Random(seed)
    rows, params = [], []
    for _ in range(64):
        row = random_row(rnd, vocab=257)
        params.append({"top_k": rnd.choice([-1, 0, 1, 2, 10, 100, 256, 257, 400]),
                       "top_p": rnd.choice([1.0, 0.99, 0.9, 0.5, 0.1, 1e-6]),
                       "min_p": rnd.choice([0.0, 0.01, 0.2, 1.0])})
        rows.append(row.logits / rnd.choice([0.3, 1.0, 1.7]))
    scaled = torch.stack(rows)
    got = S.filter_logits(scaled, [p["top_k"] for p in params], [p["top_p"] for p in params],
                          [p["min_p"] for p in params], OPS)
    want = torch.stack([ref_keep(x, **p) for x, p in zip(rows, params)])
    assert_same_bits(torch.isfinite(got), want, "kept tokens")
    assert_same_bits(got[want], scaled[want], "kept logits untouched")


def test_ties_at_a_cut_are_all_kept_and_oversized_top_k_is_off():
    scaled = torch.tensor([[3.0, 1.0, 2.0, 2.0, 0.0]])
    tied = [[True, False, True, True, False]]
    assert torch.isfinite(S.filter_logits(scaled, [2], [1.0], [0.0], OPS)).tolist() == tied
    assert torch.isfinite(S.filter_logits(scaled, [-1], [0.6], [0.0], OPS)).tolist() == tied
    assert torch.isfinite(S.filter_logits(scaled, [5], [1.0], [0.0], OPS)).all()
    assert torch.isfinite(S.filter_logits(scaled, [9], [1.0], [0.0], OPS)).all()


@pytest.mark.parametrize("params", [dict(OFF, temperature=0.9),
                                    dict(OFF, temperature=1.1, top_k=7, top_p=0.85, min_p=0.05)])
def test_empirical_distribution_matches_the_filtered_softmax(params):
    logits = torch.tensor([1.0, 0.2, -0.5, 2.0, 0.0, -2.0, 1.5, -1.0, 0.7, -3.0])
    scaled = logits / torch.tensor(params["temperature"], dtype=torch.float32)
    keep = ref_keep(scaled, params["top_k"], params["top_p"], params["min_p"])
    probs = torch.softmax(scaled.double().masked_fill(~keep, float("-inf")), -1)
    n = 40_000
    tokens = _many(logits, params, list(range(n)), [0] * n, [3] * n)
    counts = torch.bincount(tokens, minlength=logits.numel()).double()
    assert int(counts[~keep].sum()) == 0
    assert _chi2_p_value(counts[keep], probs[keep]) > 1e-4


def test_prefix_sum_is_row_local_and_correct():
    x = torch.rand(40, 1000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    full = S.inclusive_prefix_sum(x)
    for i in (0, 17, 39):
        assert_same_bits(S.inclusive_prefix_sum(x[i:i + 1]), full[i:i + 1], f"row {i}")
    assert torch.allclose(full, torch.cumsum(x, -1), rtol=1e-12, atol=0)


def test_rejects_bad_parameters():
    logits = torch.zeros(1, 8)
    # The values are SamplingParams' to refuse; a batch is built from them.
    for name, bad in (("temperature", -0.1), ("top_p", 0.0), ("top_p", 1.5), ("min_p", -0.1), ("top_k", -2)):
        with pytest.raises(ValueError, match=name):
            S.SamplingBatch.of([SamplingParams(**{name: bad})], seeds=[0], sample_indices=[0], positions=[0])
    good = S.SamplingBatch.of([SamplingParams()], seeds=[0], sample_indices=[0], positions=[0])
    with pytest.raises(ValueError, match="float32"):
        S.sample(logits.double(), good, ops=OPS)
    with pytest.raises(ValueError, match="seeds"):
        S.SamplingBatch([1.0], [-1], [1.0], [0.0], [0, 1], [0], [0])
    with pytest.raises(ValueError, match="2 rows of logits"):
        S.sample(torch.zeros(2, 8), good, ops=OPS)


def test_batch_of_params_takes_the_largest_logprobs_count():
    params = [SamplingParams(logprobs=2), SamplingParams(), SamplingParams(temperature=0.5, top_k=3, logprobs=5)]
    batch = S.SamplingBatch.of(params, [1, 2, 3], [0, 1, 0], [7, 8, 9])
    assert (batch.num_top_logprobs, batch.temperature, batch.top_k) == (5, [1.0, 1.0, 0.5], [-1, -1, 3])
    assert batch.select([2, 0]).seeds == [3, 1]


@pytest.mark.gpu
def test_cuda_tokens_equal_cpu():
    rnd = random.Random(21)
    rows = [random_row(rnd, vocab=32_000) for _ in range(96)]
    cpu = run(ours, rows)
    logits = torch.stack([r.logits for r in rows]).cuda()
    p = {name: [r.params[name] for r in rows] for name in OFF}
    batch = S.SamplingBatch(p["temperature"], p["top_k"], p["top_p"], p["min_p"], [r.seed for r in rows],
                            [r.sample_index for r in rows], [r.position for r in rows], 5)
    cuda = S.sample(logits, batch, ops=get_ops("deterministic", "cuda"))
    assert cuda.token_ids.is_cuda
    assert_same_bits(cuda.token_ids, cpu.token_ids, "tokens cuda vs cpu")


# ---- logits adjustments: min_tokens, logit_bias, allowed_token_ids, penalties ----------------------------------
@dataclass
class History:
    token_ids: list[int]
    num_prompt_tokens: int


def random_history(rnd: random.Random, vocab=VOCAB) -> History:
    # Few distinct ids, so tokens repeat and counts above 1 are exercised.
    pool = [rnd.randrange(vocab) for _ in range(12)]
    n_prompt, n_out = rnd.randrange(1, 20), rnd.randrange(0, 30)
    return History([rnd.choice(pool) for _ in range(n_prompt + n_out)], n_prompt)


def penalised_params(rnd: random.Random) -> SamplingParams:
    return SamplingParams(temperature=rnd.choice([0.0, 0.7, 1.0]), top_k=rnd.choice([-1, 40]),
                          presence_penalty=rnd.uniform(-2, 2), frequency_penalty=rnd.uniform(-2, 2),
                          repetition_penalty=rnd.uniform(0.5, 2.0))


def vllm_penalties_reference(logits, prompt, output, presence, frequency, repetition):
    """vLLM's apply_penalties written plainly: bincount masks and counts, one row at a time."""
    vocab = logits.shape[-1]
    out_counts = torch.bincount(torch.tensor(output, dtype=torch.int64), minlength=vocab)
    seen = (torch.bincount(torch.tensor(prompt, dtype=torch.int64), minlength=vocab) > 0) | (out_counts > 0)
    penalties = torch.where(seen, torch.tensor(repetition, dtype=torch.float32), torch.tensor(1.0))
    x = torch.where(logits > 0, logits / penalties, logits * penalties)
    x = x - torch.tensor(frequency, dtype=torch.float32) * out_counts
    return x - torch.tensor(presence, dtype=torch.float32) * (out_counts > 0)


def adjusted(logits, params, histories, eos=()):
    positions = [len(h.token_ids) for h in histories]
    batch = S.SamplingBatch.of(params, [0] * len(params), [0] * len(params), positions, histories, eos)
    return S.adjust_logits(logits, batch.adjust)


def test_penalties_match_the_vllm_formulas(seed):
    rnd = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(6, VOCAB, generator=g) * 3
    params = [penalised_params(rnd) for _ in range(6)]
    histories = [random_history(rnd) for _ in range(6)]
    got = adjusted(logits, params, histories)
    for i, (p, h) in enumerate(zip(params, histories, strict=True)):
        want = vllm_penalties_reference(logits[i], h.token_ids[:h.num_prompt_tokens], h.token_ids[h.num_prompt_tokens:],
                                        p.presence_penalty, p.frequency_penalty, p.repetition_penalty)
        assert_same_bits(got[i], want, f"row {i}")


def test_bias_allowed_and_min_tokens_follow_vllm():
    logits = torch.zeros(3, 8)
    params = [SamplingParams(logit_bias={3: 5.0, 100: 1.0}), SamplingParams(allowed_token_ids=[1, 6]),
              SamplingParams(min_tokens=2, stop_token_ids=[4])]
    histories = [History([0], 1), History([0], 1), History([0, 5], 1)]  # row 2 has 1 generated token of 2
    got = adjusted(logits, params, histories, eos=(7,))
    assert got[0].tolist() == [0, 0, 0, 5, 0, 0, 0, 0]  # an id outside the vocab can never be drawn: ignored
    assert torch.isfinite(got[1]).tolist() == [False, True, False, False, False, False, True, False]
    assert torch.isinf(got[2]).nonzero().flatten().tolist() == [4, 7]
    reached = adjusted(logits[2:], params[2:], [History([0, 5, 5], 1)], eos=(7,))
    assert_same_bits(reached, logits[2:], "min_tokens reached: nothing masked")
    ignore = adjusted(logits[2:], [SamplingParams(min_tokens=2, ignore_eos=True)], [History([0], 1)], eos=(7,))
    assert torch.isinf(ignore[0]).nonzero().flatten().tolist() == []


def test_greedy_takes_the_argmax_of_the_penalised_logits():
    logits = torch.tensor([[0.0, 3.0, 2.9, 0.0]])
    params = [SamplingParams(temperature=0.0, repetition_penalty=2.0)]
    batch = S.SamplingBatch.of(params, [0], [0], [2], [History([1, 1], 2)])
    out = S.sample(logits, batch, ops=OPS)
    assert int(out.token_ids[0]) == 2
    # The reported logprob stays that of the raw logits (vLLM's raw_logprobs).
    assert_same_bits(out.logprobs, OPS.log_softmax(logits, -1)[:, 2], "raw logprob")


def run_rows(rows: list[tuple[torch.Tensor, SamplingParams, History, int]]) -> S.SamplerOutput:
    params = [p for _, p, _, _ in rows]
    histories = [h for _, _, h, _ in rows]
    batch = S.SamplingBatch.of(params, [s for *_, s in rows], [0] * len(rows),
                               [len(h.token_ids) for h in histories], histories, (2,))
    return S.sample(torch.stack([x for x, *_ in rows]), batch, ops=OPS)


def random_adjusted_row(rnd: random.Random):
    g = torch.Generator().manual_seed(rnd.getrandbits(62))
    p = rnd.choice([penalised_params(rnd), SamplingParams(**rnd.choice(PARAM_MENU)),
                    SamplingParams(temperature=0.9, logit_bias={rnd.randrange(VOCAB): 3.0}, min_tokens=50,
                                   max_tokens=64)])
    return torch.randn(VOCAB, generator=g) * 2, p, random_history(rnd), rnd.getrandbits(64)


def test_penalised_row_alone_equals_row_in_batches_and_the_penalty_matters(seed):
    rnd = random.Random(seed)
    g = torch.Generator().manual_seed(seed)
    # Flat-ish logits, penalties large: the penalised tokens move, so the negative control is caught.
    logits = torch.randn(VOCAB, generator=g) * 0.1
    h = random_history(rnd)
    needle = (logits, SamplingParams(temperature=1.0, presence_penalty=2.0, frequency_penalty=1.5,
                                     repetition_penalty=1.8), h, rnd.getrandbits(64))
    alone = run_rows([needle])
    for n in (2, 5, 16, 33):
        rows = [random_adjusted_row(rnd) for _ in range(n - 1)]
        at = rnd.randrange(n)
        rows.insert(at, needle)
        out = run_rows(rows)
        for f in FIELDS:
            assert_same_bits(getattr(out, f)[at], getattr(alone, f)[0], f"{f} at {at} of {n}")
    # Negative control: a batch-coupled variant (the neighbours' histories counted too) changes the row.
    coupled = History(h.token_ids + [t for _ in range(3) for t in random_history(rnd).token_ids[1:]],
                      h.num_prompt_tokens)
    keys = [adjusted(logits[None], [needle[1]], [x])[0] for x in (h, coupled)]
    assert not torch.equal(keys[0], keys[1])


def test_rows_without_adjustments_keep_their_bits_and_skip_the_stage(seed):
    rnd = random.Random(seed)
    plain = [random_row(rnd) for _ in range(7)]
    base = run(ours, plain, k=0)
    params = [SamplingParams(**r.params) for r in plain]
    batch = S.SamplingBatch.of(params, [r.seed for r in plain], [r.sample_index for r in plain],
                               [r.position for r in plain], None)
    assert batch.adjust is None  # no row adjusts: no histories read, no adjustment kernels
    rows = [(r.logits, p, History([1], 1), r.seed) for r, p in zip(plain, params, strict=True)]
    rows.insert(3, random_adjusted_row(rnd))
    mixed = S.SamplingBatch.of([p for _, p, _, _ in rows], [s for *_, s in rows],
                               [r.sample_index for r in plain[:3]] + [0] + [r.sample_index for r in plain[3:]],
                               [r.position for r in plain[:3]] + [len(rows[3][2].token_ids)] +
                               [r.position for r in plain[3:]], [h for _, _, h, _ in rows], (2,))
    out = S.sample(torch.stack([x for x, *_ in rows]), mixed, ops=OPS)
    keep = [0, 1, 2, 4, 5, 6, 7]
    for f in FIELDS:
        assert_same_bits(getattr(out, f)[keep], getattr(base, f), f)


def test_adjustment_parameters_are_checked():
    for kwargs, field_name in (({"presence_penalty": 2.5}, "presence_penalty"),
                               ({"frequency_penalty": -3}, "frequency_penalty"),
                               ({"repetition_penalty": 0.0}, "repetition_penalty"),
                               ({"min_tokens": 20, "max_tokens": 10}, "min_tokens"),
                               ({"logit_bias": {1: 101.0}}, "logit_bias"), ({"logit_bias": {"1": 1.0}}, "logit_bias"),
                               ({"allowed_token_ids": []}, "allowed_token_ids")):
        with pytest.raises(ValueError, match=field_name):
            SamplingParams(**kwargs)
    with pytest.raises(ValueError, match="history has 1 tokens"):
        S.SamplingBatch.of([SamplingParams(repetition_penalty=1.1)], [0], [0], [5], [History([1], 1)])


@pytest.mark.gpu
def test_cuda_adjusted_rows_equal_cpu():
    rnd = random.Random(22)
    rows = [random_adjusted_row(rnd) for _ in range(32)]
    cpu = run_rows(rows)
    params, histories = [p for _, p, _, _ in rows], [h for _, _, h, _ in rows]
    batch = S.SamplingBatch.of(params, [s for *_, s in rows], [0] * len(rows),
                               [len(h.token_ids) for h in histories], histories, (2,))
    cuda = S.sample(torch.stack([x for x, *_ in rows]).cuda(), batch, ops=get_ops("deterministic", "cuda"))
    assert_same_bits(cuda.token_ids.cpu(), cpu.token_ids, "adjusted tokens cuda vs cpu")
