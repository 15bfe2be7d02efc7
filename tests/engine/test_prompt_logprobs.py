"""Prompt logprobs computed in the prefill (engine/prompt_logprobs.py): bit-equal to teacher-forced scoring and to
decode, whatever the cache, chunking, neighbours, async scheduling or preemption; the fast mode shown to differ."""
import random
import struct

import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.sampling_params import SamplingParams
from samebits.models import load_model
from samebits.models.synthetic import write_tiny_checkpoint
from tests.engine.drive import drive

# Wide enough that the fast mode's vendor matmuls block a 1-row decode differently from a prefill (the control).
SHAPE = {"hidden_size": 256, "intermediate_size": 512, "vocab_size": 1024, "num_attention_heads": 4,
         "num_key_value_heads": 2}
VOCAB = SHAPE["vocab_size"]


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama3", seed=5, **SHAPE))


@pytest.fixture(scope="module")
def models(ckpt):
    return {mode: load_model(ckpt, mode, "cpu", None) for mode in ("deterministic", "fast")}


def engine(ckpt, models, mode="deterministic", **kw) -> LLMEngine:
    kw = {"kv_cache_tokens": 4096, "max_model_len": 256, "async_scheduling": False, **kw}
    return LLMEngine(EngineConfig(model=ckpt, device="cpu", mode=mode, **kw), models[mode])


def bits(values) -> list[bytes]:
    return [struct.pack("<f", v) for v in values]


def tokens(rng: random.Random, n: int) -> list[int]:
    return [rng.randrange(3, VOCAB) for _ in range(n)]


def run(eng: LLMEngine, reqs: list[tuple[list[int], SamplingParams]]) -> dict:
    def check(out) -> None:  # every output of an asking request carries them already
        assert out.prompt_logprobs is not None or reqs[int(out.request_id[1:])][1].prompt_logprobs is None

    final = drive(eng, reqs, on_output=check, on_step=lambda e: e.scheduler.check_integrity())
    assert eng.scheduler.bm.num_free_blocks == eng.scheduler.bm.num_blocks
    return final


def prompt_lps(out) -> list[float]:
    plp = out.prompt_logprobs
    assert plp[0] is None and len(plp) == len(out.prompt_token_ids)
    return [plp[i][t].logprob for i, t in enumerate(out.prompt_token_ids) if i > 0]


def others(rng: random.Random, shared: list[int]) -> list[tuple[list[int], SamplingParams]]:
    """Neighbours: shared prefixes, sampled and greedy, n=2, top logprobs."""
    return [(shared[:rng.randrange(0, len(shared))] + tokens(rng, rng.randrange(1, 20)),
             SamplingParams(temperature=rng.choice([0.0, 1.0]), seed=rng.randrange(1 << 30), n=rng.choice([1, 2]),
                            max_tokens=rng.randrange(1, 8), ignore_eos=True, logprobs=rng.choice([None, 2])))
            for _ in range(5)]


@pytest.mark.parametrize("overlap", [False, True], ids=["sync", "async"])
@pytest.mark.parametrize("budget", [2048, 16], ids=["whole", "chunked"])
@pytest.mark.parametrize("warm", [False, True], ids=["cold", "warm"])
def test_prompt_logprobs_bits_equal_teacher_forced(ckpt, models, overlap, budget, warm, seed):
    rng = random.Random(seed)
    shared = tokens(rng, 40)
    asking = [(shared + tokens(rng, rng.randrange(1, 30)), SamplingParams(max_tokens=3, prompt_logprobs=k, n=n,
                                                                         ignore_eos=True))
              for k, n in ((0, 1), (3, 2))]
    eng = engine(ckpt, models, async_scheduling=overlap, max_num_batched_tokens=budget)
    if warm:  # the shared prefix's blocks are cached; the asking requests must compute them anyway
        run(eng, [(shared + [5], SamplingParams(max_tokens=1))])
    mixed = others(rng, shared)
    final = run(eng, mixed[:2] + asking + mixed[2:])
    for i, (prompt, params) in enumerate(asking, start=2):
        out = final[f"r{i}"]
        want = eng.score([prompt[:1]], [prompt[1:]])[0]
        assert bits(prompt_lps(out)) == bits(want)
        assert out.num_cached_tokens == 0
        k = params.prompt_logprobs
        for pos, step in enumerate(out.prompt_logprobs[1:], start=1):
            # The token first, then the top k by rank (the token's entry is the top one's when it is among them;
            # otherwise its rank is past k: the k are at least as likely).
            assert next(iter(step)) == prompt[pos] and len(step) in (k, k + 1)
            ranked = sorted(step.values(), key=lambda r: r.rank)
            assert [r.rank for r in ranked[:k]] == list(range(1, k + 1)) and ranked[-1].rank >= len(step) - 1
            assert [r.logprob for r in ranked] == sorted((r.logprob for r in ranked), reverse=True)
    for i, (prompt, params) in enumerate(mixed):
        assert final[f"r{i if i < 2 else i + 2}"].prompt_logprobs is None
    if warm:
        assert eng.scheduler.bm.stats.hits > 0, "the neighbours still hit the cache the asking requests filled"


def test_prompt_logprobs_survive_preemption_once(ckpt, models, seed):
    rng = random.Random(seed)
    # Three requests need 3 x 70 tokens of KV at once: 160 makes preemption by recompute certain.
    reqs = [(tokens(rng, 50), SamplingParams(temperature=0.0, max_tokens=20, ignore_eos=True, prompt_logprobs=1))
            for _ in range(3)]
    for overlap in (False, True):
        eng = engine(ckpt, models, async_scheduling=overlap, kv_cache_tokens=160, max_model_len=128,
                     max_num_batched_tokens=32)
        final = run(eng, reqs)
        assert eng.scheduler.num_preemptions > 0
        for i, (prompt, _) in enumerate(reqs):
            assert bits(prompt_lps(final[f"r{i}"])) == bits(eng.score([prompt[:1]], [prompt[1:]])[0])


def decode_vs_prefill(ckpt, models, mode: str, seed: int) -> tuple[list[bytes], list[bytes]]:
    """The decode logprobs of a sampled continuation, and the same tokens' logprobs as part of a prompt."""
    rng = random.Random(seed)
    prompt, eng = tokens(rng, 24), engine(ckpt, models, mode, async_scheduling=True)
    sampled = SamplingParams(temperature=1.0, seed=rng.randrange(1 << 30), max_tokens=12, ignore_eos=True,
                             logprobs=0)
    c = run(eng, [(prompt, sampled)])["r0"].outputs[0]
    scored = run(eng, [(prompt + c.token_ids, SamplingParams(max_tokens=1, prompt_logprobs=0))])["r0"]
    return bits(c.token_logprobs), bits(prompt_lps(scored)[len(prompt) - 1:])


def test_prompt_logprobs_equal_decode_logprobs(ckpt, models, seed):
    decoded, prefilled = decode_vs_prefill(ckpt, models, "deterministic", seed)
    assert decoded == prefilled


def test_negative_control_fast_mode_prefill_differs_from_decode(ckpt, models, seed):
    decoded, prefilled = decode_vs_prefill(ckpt, models, "fast", seed)
    assert decoded != prefilled


def test_prompt_rows_scored_in_slices_keep_their_bits(ckpt, models, seed, monkeypatch):
    """A long prefill scores its prompt rows ROWS_PER_SLICE at a time; the slices change no bit."""
    from samebits.engine import prompt_logprobs

    rng = random.Random(seed)
    reqs = [(tokens(rng, rng.randrange(10, 40)), SamplingParams(max_tokens=1, prompt_logprobs=2)) for _ in range(3)]
    whole = run(engine(ckpt, models), reqs)
    monkeypatch.setattr(prompt_logprobs, "ROWS_PER_SLICE", 7)
    sliced = run(engine(ckpt, models), reqs)
    for rid, out in whole.items():
        assert list(sliced[rid].prompt_logprobs) == list(out.prompt_logprobs)
        assert bits(prompt_lps(sliced[rid])) == bits(prompt_lps(out))
