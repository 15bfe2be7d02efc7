"""A request continued on another engine from what was already sent (LLMEngine.add_request's `resume`, a fleet's
failover) ends with the bits of the uninterrupted run: tokens, logprobs, top logprobs, cumulative logprob, text and
finish, for every sample of n > 1, cut at any step."""
import dataclasses
import struct

import pytest

from samebits.engine.config import EngineConfig
from samebits.engine.llm_engine import LLMEngine
from samebits.engine.outputs import Resume
from samebits.engine.sampling_params import SamplingParams, StructuredOutputsParams
from samebits.models.synthetic import write_tiny_checkpoint

PROMPT = [5, 17, 29, 3, 41, 7, 11, 13, 2, 19, 23, 31, 37, 43, 47, 53, 59]


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    ckpt = write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama3", seed=3)
    return LLMEngine(EngineConfig(model=str(ckpt), mode="deterministic", device="cpu", max_model_len=256))


def run(engine, params, resume=None) -> list:
    """Every cumulative output of one request, run to its end."""
    engine.add_request("r", PROMPT, params, resume=resume)
    outs = []
    while engine.has_unfinished_requests():
        outs += [o for o in engine.step() if o.request_id == "r"]
    return outs


def bits(out) -> list:
    def f32(xs):
        return None if xs is None else [struct.pack("<d", x) for x in xs]

    return [(c.text, list(c.token_ids), f32(c.token_logprobs), None if c.top_logprobs is None else list(c.top_logprobs),
             struct.pack("<d", c.cumulative_logprob), c.finish_reason, c.stop_reason) for c in out.outputs]


def params_for(seed: int, **kw) -> SamplingParams:
    # One sample stops early (a stop id it will draw) while the other runs to max_tokens: a resume after the first
    # finished carries one finished and one running sample.
    return SamplingParams(temperature=0.9, top_p=0.95, seed=seed, n=2, max_tokens=12, logprobs=2,
                          frequency_penalty=0.3, **kw)


def test_resumed_request_ends_bit_equal_to_the_uninterrupted_run(engine, seed):
    params = params_for(seed)
    whole = run(engine, params)
    # A stop id that ends the first sample after its third token, as long as the other sample does not draw it sooner.
    stop_id = whole[-1].outputs[0].token_ids[2]
    params = params_for(seed, stop_token_ids=[stop_id])
    whole = run(engine, params)
    assert len(whole) > 3
    assert any(sum(c.finish_reason is not None for c in o.outputs) == 1 for o in whole), "no cut has one sample done"
    for cut in range(1, len(whole) - 1):  # every step at which a fleet could lose the replica
        sent = whole[cut - 1]
        resumed = run(engine, params, Resume.of(sent))
        assert bits(resumed[-1]) == bits(whole[-1]), f"cut after output {cut}"
        # Cumulative from the first token on: the stream carries on from what the client holds.
        assert all(list(r.token_ids[:len(s.token_ids)]) == list(s.token_ids)
                   for r, s in zip(resumed[0].outputs, sent.outputs))


def test_resume_without_the_sent_prefix_changes_the_answer(engine, seed):
    """Negative control: the same tokens resumed as a new prompt (no teacher-forced outputs, positions and penalties
    restarted) do not give the continuation's bits."""
    params = params_for(seed)
    whole = run(engine, params)
    sent = whole[len(whole) // 2]
    cut = len(sent.outputs[0].token_ids)
    engine.add_request("r", PROMPT + list(sent.outputs[0].token_ids), dataclasses.replace(params, n=1))
    tail = []
    while engine.has_unfinished_requests():
        tail = [o for o in engine.step() if o.request_id == "r"] or tail
    assert list(tail[-1].outputs[0].token_ids) != list(whole[-1].outputs[0].token_ids[cut:])


def test_resume_is_refused_for_another_seed(engine):
    sent = run(engine, params_for(1))[1]
    with pytest.raises(ValueError, match="seed"):
        engine.add_request("x", PROMPT, params_for(2), resume=Resume.of(sent))
    assert not engine.has_unfinished_requests()


def test_a_constrained_request_resumes_inside_its_grammar(engine, seed):
    """The grammar of a resumed sample takes the sent tokens first: its next mask is the one the uninterrupted run
    had (a grammar restarted at the cut would allow other tokens, or fail the mask's position check)."""
    so = StructuredOutputsParams(regex=r"[a-f]{3,8}-[0-9]{2,6}")
    params = SamplingParams(temperature=0.9, seed=seed, n=2, max_tokens=12, logprobs=1, structured_outputs=so)
    whole = run(engine, params)
    assert len(whole) > 3
    for cut in (1, len(whole) // 2, len(whole) - 2):
        resumed = run(engine, params, Resume.of(whole[cut - 1]))
        assert bits(resumed[-1]) == bits(whole[-1]), f"cut after output {cut}"
