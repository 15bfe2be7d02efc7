"""The field policy: every refused field is a 400 naming it; every implemented one does what it says, through the real
`openai` client; n > 1 streams one choice per chunk."""
from __future__ import annotations

import openai
import pytest

from samebits.server.fields import BOOKKEEPING, REFUSED, REFUSED_IN_MESSAGE, REFUSED_IN_STREAM_OPTIONS
from tests.server.conftest import MODEL_NAME
from tests.server.test_bad_inputs import CHAT, CMPL, c, ch, check_error

PATH = {"completions": CMPL, "chat": CHAT}
# Values a client would really send; the rest of the table gets a value that is neutral for none of them.
REAL = {"response_format": {"type": "json_object"}, "bad_words": ["x"],
        "tools": [{"type": "function", "function": {"name": "f", "parameters": {}}}], "tool_choice": "required",
        "suffix": "tail", "best_of": 2, "echo": True, "use_beam_search": True, "guided_choice": ["a", "b"]}
REFUSED_CASES = [(e, name, REAL.get(name, 7)) for e in REFUSED for name in sorted(REFUSED[e])]
# Tools are chat's; completions refuse them.
ISSUE_REFUSED = {"completions": ("tools", "tool_choice", "parallel_tool_calls"), "chat": ()}
ISSUE_IMPLEMENTED = ("repetition_penalty", "min_tokens", "presence_penalty", "frequency_penalty", "logit_bias",
                     "prompt_logprobs",
                     "include_stop_str_in_output", "skip_special_tokens", "add_generation_prompt",
                     "continue_final_message", "chat_template_kwargs", "response_format", "structured_outputs",
                     "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_decoding_backend",
                     "guided_whitespace_pattern", "tools", "tool_choice", "parallel_tool_calls")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def test_the_issues_fields_are_in_the_table_or_typed():
    from samebits.server.protocol import ChatRequest

    for endpoint in REFUSED:
        assert set(ISSUE_REFUSED[endpoint]) <= set(REFUSED[endpoint])
        assert not set(BOOKKEEPING) & set(REFUSED[endpoint])
        assert not (set(ISSUE_IMPLEMENTED) - set(ISSUE_REFUSED[endpoint])) & set(REFUSED[endpoint])
    assert set(ISSUE_IMPLEMENTED) <= set(ChatRequest.model_fields)


@pytest.mark.parametrize("endpoint,name,value", REFUSED_CASES, ids=[f"{e}-{n}" for e, n, _ in REFUSED_CASES])
def test_refused_field_is_a_400_naming_it(server, endpoint, name, value):
    body = (c if endpoint == "completions" else ch)(**{name: value})
    with server.client() as http:
        check_error(http.post(PATH[endpoint], json=body), 400, name, [name, "not supported"])


USER = {"role": "user", "content": "hi"}
REPLAYED = {"role": "assistant", "content": "hello", "tool_calls": [], "refusal": None, "annotations": [],
            "audio": None, "function_call": None}
NESTED_CASES = [
    ("tool_calls", ch(messages=[USER, {**REPLAYED, "tool_calls": [{"id": "1", "type": "function"}]}, USER]),
     "messages", ["messages.1.tool_calls.0.function", "required"]),
    ("message_unknown", ch(messages=[{**USER, "colour": "red"}]), "messages", ["messages[0].colour", "unknown"]),
    ("part_unknown", ch(messages=[{"role": "user", "content": [{"type": "text", "text": "a", "cache_control": {}}]}]),
     "messages", ["messages[0].content[0].cache_control"]),
    ("image_part", ch(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]),
     "messages", ["only text parts", "image_url"]),
    ("continuous_usage_stats", ch(stream=True, stream_options={"include_usage": True, "continuous_usage_stats": True}),
     "stream_options", ["stream_options.continuous_usage_stats", "not supported"]),
]


@pytest.mark.parametrize("name,body,param,words", NESTED_CASES, ids=[x[0] for x in NESTED_CASES])
def test_refused_field_inside_an_object_is_a_400_naming_it(server, name, body, param, words):
    with server.client() as http:
        check_error(http.post(CHAT, json=body), 400, param, words)


def test_replayed_assistant_message_with_neutral_fields_is_accepted(server):
    with server.client() as http:
        plain = http.post(CHAT, json=ch(temperature=0,
                                        messages=[USER, {"role": "assistant", "content": "hello"}, USER]))
        replayed = http.post(CHAT, json=ch(temperature=0, messages=[USER, REPLAYED, USER],
                                           stream_options={"continuous_usage_stats": False}))
    assert plain.status_code == replayed.status_code == 200, replayed.text
    assert plain.json()["choices"][0]["token_ids"] == replayed.json()["choices"][0]["token_ids"]
    assert plain.json()["usage"]["prompt_tokens"] == replayed.json()["usage"]["prompt_tokens"]


def _completion(client, **kw):
    return client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=24, temperature=1.0, seed=11,
                                     extra_body={"ignore_eos": True, **kw.pop("extra", {})}, **kw).choices[0]


def test_include_stop_str_in_output(client):
    full = _completion(client).text
    # The random model writes byte soup: cut at three whole characters.
    stop = next(full[i:i + 3] for i in range(4, len(full) - 3) if "\ufffd" not in full[i:i + 3])
    cut = _completion(client, stop=[stop])
    kept = _completion(client, stop=[stop], extra={"include_stop_str_in_output": True})
    assert (cut.text, cut.finish_reason, cut.model_extra["stop_reason"]) == (full[:full.find(stop)], "stop", stop)
    assert (kept.text, kept.token_ids) == (full[:full.find(stop) + len(stop)], cut.token_ids)
    streamed = client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=24, temperature=1.0, seed=11,
                                         stop=[stop], stream=True,
                                         extra_body={"ignore_eos": True, "include_stop_str_in_output": True})
    assert "".join(ch.choices[0].text for ch in streamed if ch.choices) == kept.text


def test_skip_special_tokens(server, client):
    tok = server.engine.tokenizer
    kw = {"model": MODEL_NAME, "prompt": "the cat", "max_tokens": 32, "temperature": 2.0, "seed": 5, "n": 8}
    kept = client.completions.create(**kw, extra_body={"ignore_eos": True, "skip_special_tokens": False}).choices
    skipped = client.completions.create(**kw, extra_body={"ignore_eos": True}).choices
    assert [k.token_ids for k in kept] == [s.token_ids for s in skipped]
    assert [k.text for k in kept] == [tok.decode(k.token_ids, skip_special_tokens=False) for k in kept]
    assert [s.text for s in skipped] == [tok.decode(s.token_ids) for s in skipped]
    assert any("<|" in k.text for k in kept) and not any("<|" in s.text for s in skipped)


def _chat_prompt_tokens(client, messages, **extra) -> int:
    r = client.chat.completions.create(model=MODEL_NAME, messages=messages, max_tokens=1, temperature=0,
                                       extra_body=extra)
    return r.usage.prompt_tokens


def test_chat_template_options(server, client):
    tok = server.engine.tokenizer
    msgs = [{"role": "user", "content": "hello world"}]
    opened = msgs + [{"role": "assistant", "content": "The answer is"}]

    def n_tokens(m, gen):
        return len(tok.encode(tok.apply_chat_template(m, add_generation_prompt=gen), add_special_tokens=False))

    assert _chat_prompt_tokens(client, msgs) == n_tokens(msgs, True)
    assert _chat_prompt_tokens(client, msgs, add_generation_prompt=False) == n_tokens(msgs, False) < \
        n_tokens(msgs, True)
    # The open final message drops the template's end-of-turn tokens ("<|im_end|>", "\n").
    assert _chat_prompt_tokens(client, opened, add_generation_prompt=False, continue_final_message=True) == \
        n_tokens(opened, False) - 2
    assert _chat_prompt_tokens(client, msgs, chat_template_kwargs={"enable_thinking": False}) == n_tokens(msgs, True)
    with server.client() as http:
        check_error(http.post(CHAT, json=ch(continue_final_message=True)), 400, "continue_final_message",
                    ["add_generation_prompt"])
        check_error(http.post(CHAT, json=ch(chat_template_kwargs={"tools": []})), 400, "chat_template_kwargs",
                    ["tools"])


def test_chat_content_parts_equal_text(client):
    kw = {"model": MODEL_NAME, "max_tokens": 6, "temperature": 0.7, "seed": 2, "extra_body": {"ignore_eos": True}}
    text = client.chat.completions.create(messages=[{"role": "user", "content": "hello world"}], **kw)
    parts = client.chat.completions.create(messages=[{"role": "user", "content": [
        {"type": "text", "text": "hello "}, {"type": "text", "text": "world"}]}], **kw)
    assert parts.choices[0].model_extra["token_ids"] == text.choices[0].model_extra["token_ids"]
    assert parts.usage.prompt_tokens == text.usage.prompt_tokens


@pytest.mark.parametrize("kind", ["completions", "chat"])
def test_streaming_n_sends_one_choice_per_chunk(client, kind):
    kw = {"model": MODEL_NAME, "max_tokens": 5, "temperature": 1.0, "seed": 9, "n": 3,
          "extra_body": {"ignore_eos": True}}
    if kind == "chat":
        api, kw["messages"] = client.chat.completions, [{"role": "user", "content": "hi"}]
    else:
        api, kw["prompt"] = client.completions, ["the cat", "hello"]
    whole = api.create(**kw)
    chunks = list(api.create(stream=True, **kw))
    want = {c.index: c.message.content if kind == "chat" else c.text for c in whole.choices}
    assert chunks and all(len(chunk.choices) == 1 for chunk in chunks)
    got: dict[int, str] = {}
    finished = set()
    for chunk in chunks:
        choice = chunk.choices[0]
        piece = (choice.delta.content or "") if kind == "chat" else choice.text
        got[choice.index] = got.get(choice.index, "") + piece
        if choice.finish_reason is not None:
            finished.add(choice.index)
    assert got == want and finished == set(want) and len(want) == (3 if kind == "chat" else 6)


def test_readme_lists_every_refused_and_bookkeeping_field():
    from pathlib import Path

    readme = (Path(__file__).parents[2] / "README.md").read_text()
    names = set(BOOKKEEPING).union(*REFUSED.values(), REFUSED_IN_MESSAGE, REFUSED_IN_STREAM_OPTIONS)
    assert [n for n in sorted(names) if f"`{n}`" not in readme] == []


def _tokens(client, **kw) -> list[list[int]]:
    base = {"model": MODEL_NAME, "prompt": "the cat sat", "max_tokens": 12, "temperature": 1.0, "seed": 3}
    extra = {"ignore_eos": True, **kw.pop("extra", {})}
    return [c.model_extra["token_ids"] for c in client.completions.create(**{**base, **kw}, extra_body=extra).choices]


def test_penalties_change_the_sample_and_are_bitwise_stable_under_batching(client):
    import concurrent.futures

    penalised = {"presence_penalty": 2.0, "frequency_penalty": 2.0, "extra": {"repetition_penalty": 1.5}}
    plain = _tokens(client, temperature=0.0)[0]
    greedy = _tokens(client, temperature=0.0, **penalised)[0]
    assert greedy != plain  # the penalties act (a random model repeats under plain greedy)
    assert len(set(greedy)) > len(set(plain))
    alone = client.completions.create(model=MODEL_NAME, prompt="the cat sat", max_tokens=12, temperature=1.0, seed=3,
                                      logprobs=2, presence_penalty=1.0, frequency_penalty=0.5,
                                      extra_body={"ignore_eos": True, "repetition_penalty": 1.3}).choices[0]
    with concurrent.futures.ThreadPoolExecutor(8) as pool:  # neighbours with and without penalties
        jobs = [pool.submit(_tokens, client, seed=i, n=2, **(penalised if i % 2 else {})) for i in range(6)]
        again = pool.submit(lambda: client.completions.create(
            model=MODEL_NAME, prompt="the cat sat", max_tokens=12, temperature=1.0, seed=3, logprobs=2,
            presence_penalty=1.0, frequency_penalty=0.5,
            extra_body={"ignore_eos": True, "repetition_penalty": 1.3}).choices[0])
        [j.result() for j in jobs]
    batched = again.result()
    assert batched.model_extra["token_ids"] == alone.model_extra["token_ids"]
    assert batched.logprobs.token_logprobs == alone.logprobs.token_logprobs  # floats from JSON: exact float32 values


def test_logit_bias_allowed_token_ids_and_min_tokens(server, client):
    plain = _tokens(client, temperature=0.0)[0]
    forced = _tokens(client, temperature=0.0, logit_bias={"7": 100})[0]
    assert forced == [7] * 12 and plain != forced
    allowed = _tokens(client, temperature=1.5, n=4, extra={"allowed_token_ids": [3, 9, 11]})
    assert {t for row in allowed for t in row} <= {3, 9, 11}
    eos = min(server.engine.tokenizer.eos_token_ids)
    # eos pushed to the top: without min_tokens the sample ends at once; with it, eos waits for 5 tokens.
    kw = {"prompt": "the cat", "max_tokens": 12, "temperature": 0.0, "logit_bias": {str(eos): 100}}
    short = client.completions.create(model=MODEL_NAME, **kw).choices[0]
    held = client.completions.create(model=MODEL_NAME, **kw, extra_body={"min_tokens": 5}).choices[0]
    assert (len(short.model_extra["token_ids"]), short.finish_reason) == (1, "stop")
    assert (len(held.model_extra["token_ids"]), held.finish_reason) == (6, "stop")
    assert eos not in held.model_extra["token_ids"][:5]
