"""Prompt logprobs over HTTP with the real `openai` client: echo with logprobs (OpenAI's legacy shape, max_tokens=0
scoring), vLLM's prompt_logprobs field on completions and chat; float32 bits equal to teacher-forced scoring and to
decode after the JSON trip."""
from __future__ import annotations

import struct

import openai
import pytest

from samebits.engine.llm import LLM
from samebits.engine.prompts import render_chat
from tests.server.conftest import MODEL_NAME

PROMPT = [11, 52, 7, 300, 91, 14, 250, 33, 8]


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture(scope="module")
def scored(tiny_model_dir):
    """The offline teacher-forced logprobs of a token list: the reference every HTTP answer must equal."""
    llm = LLM(model=str(tiny_model_dir), mode="deterministic", device="cpu", max_model_len=256)
    return lambda ids: llm.teacher_forced_logprobs(ids[:1], ids[1:])


def bits(values) -> list[bytes]:
    return [struct.pack("<f", v) for v in values]


def test_echo_with_logprobs_scores_the_prompt_then_the_completion(server, client, scored):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=4, temperature=0, echo=True,
                                  logprobs=2, extra_body={"ignore_eos": True})
    choice, n = r.choices[0], len(PROMPT)
    lp = choice.logprobs
    generated = choice.model_extra["token_ids"]
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == len(lp.text_offset) == n + 4
    assert lp.tokens[:n] == [server.engine.tokenizer.decode([t], skip_special_tokens=False) for t in PROMPT]
    assert lp.token_logprobs[0] is None and lp.top_logprobs[0] is None
    assert bits(lp.token_logprobs[1:]) == bits(scored(PROMPT + generated))
    # Each token is among its own alternatives, as OpenAI's and vLLM's: 2 others, or 1 when it is among the best 2.
    assert all(len(top) in (2, 3) and tok in top for tok, top in zip(lp.tokens[1:], lp.top_logprobs[1:]))
    offsets = [0]
    for s in lp.tokens[:-1]:
        offsets.append(offsets[-1] + len(s))
    assert lp.text_offset == offsets and choice.text.startswith(server.engine.tokenizer.decode(PROMPT))


def test_echo_with_max_tokens_0_scores_the_prompt_alone_bit_equal_to_decode(client):
    gen = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=6, temperature=1.0, seed=4,
                                    logprobs=0, extra_body={"ignore_eos": True}).choices[0]
    ids = gen.model_extra["token_ids"]
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT + ids, max_tokens=0, echo=True, logprobs=0)
    choice = r.choices[0]
    assert choice.model_extra["token_ids"] == [] and len(choice.logprobs.tokens) == len(PROMPT) + len(ids)
    assert bits(choice.logprobs.token_logprobs[len(PROMPT):]) == bits(gen.logprobs.token_logprobs)
    # logprobs=0 gives each step's sampled token as its one alternative, as OpenAI's and vLLM's (not {}).
    assert gen.logprobs.top_logprobs == [{t: v} for t, v in zip(gen.logprobs.tokens, gen.logprobs.token_logprobs)]
    # No token is generated: usage counts none, streamed or not (the one drawn to score the prompt is not answered).
    assert (r.usage.prompt_tokens, r.usage.completion_tokens) == (len(PROMPT) + len(ids), 0)
    chunks = list(client.completions.create(model=MODEL_NAME, prompt=PROMPT + ids, max_tokens=0, echo=True,
                                            stream=True, stream_options={"include_usage": True}))
    assert chunks[-1].usage.model_dump() == r.usage.model_dump()


def test_streamed_echo_with_logprobs_equals_the_body(client):
    kw = {"model": MODEL_NAME, "prompt": "the cat sat on", "max_tokens": 5, "temperature": 0, "echo": True,
          "logprobs": 1, "extra_body": {"ignore_eos": True}}
    body = client.completions.create(**kw).choices[0]
    text, lps = "", {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
    for chunk in client.completions.create(stream=True, **kw):
        piece = chunk.choices[0]
        text += piece.text
        for key in lps:
            lps[key] += getattr(piece.logprobs, key) if piece.logprobs else []
    # text_offset too: a streamed token's offset counts the tokens' text before it, not the (held back) text sent.
    assert text == body.text and lps == body.logprobs.model_dump()


def test_prompt_logprobs_field_is_vllm_shaped_on_completions_and_chat(server, client, scored):
    r = client.completions.create(model=MODEL_NAME, prompt=PROMPT, max_tokens=2, n=2, temperature=1.0, seed=2,
                                  extra_body={"prompt_logprobs": 3})
    want = bits(scored(PROMPT))
    for choice in r.choices:
        plp = choice.model_extra["prompt_logprobs"]
        assert plp[0] is None and len(plp) == len(PROMPT) and choice.logprobs is None
        for pos, step in enumerate(plp[1:], start=1):
            token = str(PROMPT[pos])
            assert token in step and len(step) in (3, 4) and set(step[token]) == {"logprob", "rank", "decoded_token"}
            assert sorted(v["rank"] for v in step.values())[:3] == [1, 2, 3]
            assert step[token]["decoded_token"] == server.engine.tokenizer.decode([PROMPT[pos]],
                                                                                 skip_special_tokens=False)
        assert bits(step[str(PROMPT[pos])]["logprob"] for pos, step in enumerate(plp) if pos) == want
    messages = [{"role": "user", "content": "hi"}]
    chat = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=2,
                                          extra_body={"prompt_logprobs": 0})
    plp = chat.model_extra["prompt_logprobs"]  # vLLM's place: beside the choices
    ids = render_chat(server.engine.tokenizer, messages, True, False, None)
    assert plp[0] is None and [list(step) for step in plp[1:]] == [[str(t)] for t in ids[1:]]
    assert bits(step[str(t)]["logprob"] for step, t in zip(plp[1:], ids[1:])) == bits(scored(ids))
