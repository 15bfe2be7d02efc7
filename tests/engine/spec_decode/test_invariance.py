"""Speculative decoding gives plain decoding's bits on CPU: token ids, float32 logprob bits, top logprobs, finish and
stop reasons, prompt logprobs; greedy and seeded sampling, n > 1, alone and in batches of 1-64, with preemption,
chunked prefill, prefix caching, penalties and stop rules; and standard speculative sampling does not (the control).

A tiny random model (its logits near uniform, so seeded rows at a low temperature are where drafts get accepted).
"""
import dataclasses
import random

import pytest
import torch

from samebits.engine.config import EngineConfig
from samebits.engine.llm import LLM
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.model_runner import ModelRunner
from samebits.engine.outputs import Resume
from samebits.engine.sampler import SamplerOutput, token_ranks, top_k_logprobs
from samebits.engine.sampling_params import SamplingParams, StructuredOutputsParams
from samebits.engine.spec_decode import drafters, speculator
from samebits.models.synthetic import write_tiny_checkpoint

SHAPE = {"hidden_size": 256, "intermediate_size": 512, "vocab_size": 1024, "num_attention_heads": 4,
         "num_key_value_heads": 2}
SMALL = {"hidden_size": 128, "intermediate_size": 256, "vocab_size": 1024, "num_attention_heads": 2,
         "num_key_value_heads": 1, "num_hidden_layers": 1}
ENGINE = {"device": "cpu", "kv_cache_tokens": 4096, "max_num_batched_tokens": 256}
GREEDY = SamplingParams(temperature=0.0, max_tokens=12, logprobs=3, ignore_eos=True)
# A low temperature on near-uniform logits: the race still decides, and drafts are accepted often enough to matter.
COOL = SamplingParams(temperature=0.05, seed=11, n=2, max_tokens=12, logprobs=3, ignore_eos=True)
WARM = SamplingParams(temperature=0.8, seed=3, max_tokens=8, logprobs=1, ignore_eos=True)


def ngram(k: int) -> dict:
    return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("target"), "llama3", seed=1, **SHAPE))


@pytest.fixture(scope="module")
def small(tmp_path_factory):
    return str(write_tiny_checkpoint(tmp_path_factory.mktemp("draft"), "llama3", seed=2, **SMALL))


def prompts(n: int, seed: int, longest: int = 40) -> list[list[int]]:
    rng = random.Random(seed)
    # Small token ids repeat within a prompt, so prompt lookup finds matches from the first step.
    return [[rng.randrange(3, 40) for _ in range(rng.randint(3, longest))] for _ in range(n)]


def bits(out) -> list[tuple]:
    """Everything a sample reports, logprobs as their float32 bit patterns, the sampled tokens' ranks too."""
    def f32(values):
        return None if values is None else torch.tensor(values, dtype=torch.float32).view(torch.int32).tolist()

    def tops(c):
        return [sorted((t, f32([v])[0]) for t, v in step.items()) for step in c.top_logprobs or ()]

    prompt = [(t, f32([lp.logprob])[0], lp.rank) for step in out.prompt_logprobs or () if step
              for t, lp in step.items()]
    return [(tuple(c.token_ids), f32(c.token_logprobs), tops(c), c.text, c.finish_reason, c.stop_reason, prompt,
             None if c.token_ranks is None else list(c.token_ranks)) for c in out.outputs]


def run(llm, ps, params) -> list:
    return [bits(o) for o in llm.generate(ps, params, use_tqdm=False)]


MIXED = [GREEDY] * 3 + [COOL] * 2 + [WARM]


@pytest.fixture(scope="module")
def plain(ckpt):
    llm = LLM(ckpt, **ENGINE)
    return llm, run(llm, prompts(6, 1), MIXED)


@pytest.mark.parametrize("spec", ["ngram-2", "ngram-4", "ngram-8", "draft-same", "draft-small"])
def test_speculation_gives_plain_decodings_bits(ckpt, small, plain, spec):
    method, k = spec.split("-")
    config = ngram(int(k)) if method == "ngram" else {"method": "draft_model", "num_speculative_tokens": 4,
                                                       "model": ckpt if k == "same" else small}
    llm = LLM(ckpt, speculative_config=config, **ENGINE)
    assert run(llm, prompts(6, 1), MIXED) == plain[1]
    stats = llm.engine.stats()
    # A random draft model of its own is the overhead case: it may never be right.
    assert stats.spec_num_accepted_tokens > 0 or spec == "draft-small"
    assert stats.spec_num_draft_tokens > stats.spec_num_accepted_tokens
    assert sum(stats.spec_accepted_per_pos) == stats.spec_num_accepted_tokens
    llm.engine.scheduler.check_integrity()


def test_batches_of_1_to_64_with_preemption(ckpt, plain):
    """64 requests in a KV pool of 20 blocks (preempted and recomputed, drafts included), and one of them alone."""
    ps = prompts(64, 2, longest=12)
    short = [dataclasses.replace(p, max_tokens=6, n=1) for p in (GREEDY, COOL)]
    params = [short[i % 2] for i in range(64)]
    expected = run(plain[0], ps, params)
    tight = LLM(ckpt, speculative_config=ngram(4), **{**ENGINE, "kv_cache_tokens": 320, "max_num_seqs": 64})
    assert run(tight, ps, params) == expected
    stats = tight.engine.stats()
    assert stats.num_preemptions > 0 and stats.spec_num_accepted_tokens > 0
    assert run(tight, [ps[9]], params[9]) == [expected[9]], "a request alone"


def test_stop_rules_penalties_prompt_logprobs_chunked_prefill_and_prefix_hits(ckpt):
    """Rules that read a row's history or cut an output inside a verified chunk: stop strings, stop ids, eos,
    min_tokens, penalties and logit bias; prompt logprobs, a 24-token budget that chunks prompts, and repeated
    prompts that hit the prefix cache."""
    ps = prompts(6, 3, longest=24)
    ps += [ps[0] + ps[1]]  # a shared prefix: a hit once the first's blocks are cached
    plain_llm = LLM(ckpt, **{**ENGINE, "max_num_batched_tokens": 24})
    probe = run(plain_llm, ps[:2], GREEDY)
    text, ids = probe[0][0][3], probe[1][0][0]
    params = [
        SamplingParams(temperature=0.0, max_tokens=12, stop=[text[6:8]], include_stop_str_in_output=True),
        SamplingParams(temperature=0.0, max_tokens=12, stop_token_ids=[ids[5]], logprobs=2),
        SamplingParams(temperature=0.05, seed=5, max_tokens=12, repetition_penalty=1.3, frequency_penalty=0.4,
                       presence_penalty=0.2, logprobs=1),
        SamplingParams(temperature=0.0, max_tokens=12, min_tokens=6, logit_bias={ids[3]: 3.0}, prompt_logprobs=2),
        SamplingParams(temperature=0.05, seed=9, n=3, max_tokens=12, prompt_logprobs=0, logprobs=0),
        SamplingParams(temperature=0.0, max_tokens=12, repetition_penalty=0.7),
    ] + [COOL]
    expected = run(plain_llm, ps, params)
    assert [o[0][4] for o in expected[:2]] == ["stop", "stop"]  # the rules did cut outputs
    for spec in (ngram(4), {"method": "draft_model", "num_speculative_tokens": 5, "model": ckpt}):
        llm = LLM(ckpt, speculative_config=spec, **{**ENGINE, "max_num_batched_tokens": 24})
        assert run(llm, ps, params) == expected
        stats = llm.engine.stats()
        assert stats.spec_num_accepted_tokens > 0 and stats.prefix_hits > 0


def ratio_draw(self, logits, batch, items) -> SamplerOutput:
    """Standard speculative sampling (Leviathan et al.; vLLM's rejection sampler) for a drafter that proposes one
    token (q = 1 there): a draft is kept with probability p(draft), else its row draws from p without it; other rows
    draw as the sampler does. The same distribution as plain decoding, other bits."""
    out = self.sampler(logits, batch)
    tokens, row = out.token_ids.clone(), 0
    for item in items:
        for i, draft in enumerate(item.drafts):
            r = row + i
            if batch.temperature[r] > 0:
                p = torch.softmax(logits[r] / batch.temperature[r], dim=-1)
                gen = torch.Generator().manual_seed(batch.seeds[r] * 1_000_003 + batch.positions[r])
                if torch.rand((), generator=gen) >= p[draft]:
                    p[draft] = 0.0
                    tokens[r] = torch.multinomial(p, 1, generator=gen)[0]
                else:
                    tokens[r] = draft
        row += 1 + len(item.drafts)
    logprobs = self.sampler.ops.log_softmax(logits, dim=-1)
    picked = logprobs.gather(1, tokens[:, None])
    return SamplerOutput(tokens, picked[:, 0], *top_k_logprobs(logprobs, batch.num_top_logprobs),
                         token_ranks(logprobs, picked) if batch.ranks else None)


def test_negative_control_standard_speculative_sampling_changes_the_bits(ckpt, plain, monkeypatch):
    """Accepting by probability ratio is lossless in distribution only: the same comparison sees other outputs."""
    monkeypatch.setattr(ModelRunner, "_draw", ratio_draw)
    llm = LLM(ckpt, speculative_config={"method": "draft_model", "num_speculative_tokens": 4, "model": ckpt}, **ENGINE)
    got = run(llm, prompts(6, 1), MIXED)
    assert got[:3] == plain[1][:3]  # greedy rows: p is one-hot, the ratio rule is the exact rule
    assert got[3:] != plain[1][3:]


def constrained(seed: int) -> SamplingParams:
    return SamplingParams(temperature=0.05, seed=seed, n=2, max_tokens=12, logprobs=2,
                          structured_outputs=StructuredOutputsParams(regex=r"[a-f]{3,8}-[0-9]{2,9}"))


def test_a_constrained_request_among_speculating_ones_keeps_plain_decodings_bits(ckpt, plain):
    """A sample with a grammar is never drafted for (spec_decode/drafters.py draftable): it decodes a row a step in
    its neighbours' verify steps, with the bits it has without speculation; alone, it drafts nothing."""
    ps, params = prompts(4, 5), [constrained(7), GREEDY, COOL, constrained(8)]
    expected = run(plain[0], ps, params)
    llm = LLM(ckpt, speculative_config=ngram(4), **ENGINE)
    assert run(llm, ps, params) == expected
    assert llm.engine.stats().spec_num_accepted_tokens > 0
    alone = LLM(ckpt, speculative_config=ngram(4), **ENGINE)
    assert run(alone, ps[:1], params[0]) == expected[:1]
    assert alone.engine.stats().spec_num_drafts == 0


def test_negative_control_drafts_for_a_constrained_sample_fail_its_mask_check(ckpt, monkeypatch):
    """Without the exclusion, a verify row past the first asks for a mask its matcher has not reached: refused
    loudly (structured/grammar.py GrammarMatcher.check), never masked with the wrong state."""
    for module in (drafters, speculator):
        monkeypatch.setattr(module, "draftable", lambda seq: seq.num_uncomputed == 1)
    llm = LLM(ckpt, speculative_config=ngram(4), **ENGINE)
    with pytest.raises(RuntimeError, match="its grammar has taken"):
        run(llm, prompts(1, 5), constrained(7))


def test_an_fp8_target_keeps_plain_decodings_bits(ckpt, small):
    """`quantization="fp8"` (per-token activation scales, models/fp8.py): a verify row's activations are quantised
    by their own row, so the drafts' rows change no bit. Drafted by ngram, by the FP8 target itself (shared), and by a
    dense random draft (its checkpoint's own weights)."""
    fp8 = {**ENGINE, "quantization": "fp8"}
    ps, params = prompts(4, 6), [GREEDY, COOL, WARM, GREEDY]
    expected = run(LLM(ckpt, **fp8), ps, params)
    for spec in (ngram(4), {"method": "draft_model", "num_speculative_tokens": 3, "model": ckpt},
                 {"method": "draft_model", "num_speculative_tokens": 3, "model": small}):
        llm = LLM(ckpt, speculative_config=spec, **fp8)
        assert type(llm.engine.loaded.model).__name__ == "Fp8LlamaModel"
        assert run(llm, ps, params) == expected, spec
        assert llm.engine.stats().spec_num_accepted_tokens > 0 or spec["model"] == small


def outputs(engine, prompt, params, resume=None) -> list:
    """Every cumulative output of one request run to its end on `engine` (tests/engine/test_resume.py's run)."""
    engine.add_request("r", prompt, params, resume=resume)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == "r"]
    return outs


def test_a_resumed_request_under_speculation_ends_with_the_uninterrupted_bits(ckpt):
    """A fleet's failover (LLMEngine.add_request's `resume`): a stream cut on a plain engine and resumed on a
    speculating one, whose drafter (the target as its own draft) reads the sent tokens as its own, ends with the
    plain run's bits."""
    config = {"method": "draft_model", "num_speculative_tokens": 3, "model": ckpt}
    prompt, params = prompts(1, 8)[0], dataclasses.replace(COOL, frequency_penalty=0.3)
    whole = outputs(LLMEngine(EngineConfig(ckpt, **ENGINE)), prompt, params)
    engine = LLMEngine(EngineConfig(ckpt, speculative_config=config, **ENGINE))
    for cut in (1, len(whole) // 2, len(whole) - 2):
        resumed = outputs(engine, prompt, params, Resume.of(whole[cut - 1]))
        assert bits(resumed[-1]) == bits(whole[-1]), f"cut after output {cut}"
    assert engine.stats().spec_num_accepted_tokens > 0
