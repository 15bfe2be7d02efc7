"""The happy paths through the real `openai` client and raw HTTP: bodies, headers, streaming, seeds, logprobs."""
from __future__ import annotations

import json
import struct

import openai
import pytest

from tests.server.conftest import MODEL_NAME

NUMERICS_HEADERS = ("x-samebits-fingerprint", "x-samebits-engine-version", "x-samebits-torch-version",
                    "x-samebits-cuda-version", "x-samebits-cublas-version", "x-samebits-driver-version",
                    "x-samebits-kernel-flags", "x-samebits-mode", "x-samebits-weights", "x-samebits-dtype",
                    "x-samebits-tensor-parallel-size", "x-samebits-all-reduce", "x-samebits-tp-invariant",
                    "x-request-id")


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=f"{server.url}/v1", api_key="unused", max_retries=0, timeout=120)


def is_float32(x: float) -> bool:
    return struct.unpack("<f", struct.pack("<f", x))[0] == x


def sse_events(text: str) -> list:
    lines = [ln for ln in text.split("\n\n") if ln]
    assert lines[-1] == "data: [DONE]"
    return [json.loads(ln.removeprefix("data: ")) for ln in lines[:-1]]


def test_completion_basic(client):
    r = client.completions.create(model=MODEL_NAME, prompt="hello world", max_tokens=4, temperature=0)
    c = r.choices[0]
    assert len(c.token_ids) <= 4 and c.finish_reason in ("length", "stop")
    assert r.usage.completion_tokens == len(c.token_ids)
    assert r.system_fingerprint and r.object == "text_completion"


def test_greedy_repeats_and_headers(server, client):
    raw = client.completions.with_raw_response.create(model=MODEL_NAME, prompt="the cat", max_tokens=4,
                                                      temperature=0, extra_headers={"X-Request-Id": "abc-123"})
    for h in NUMERICS_HEADERS:
        assert raw.headers.get(h), h
    assert raw.headers["x-request-id"] == "abc-123"
    assert raw.headers["x-samebits-mode"] == "deterministic" and raw.headers["x-samebits-dtype"] == "float32"
    first = raw.parse()
    assert raw.headers["x-samebits-fingerprint"] == first.system_fingerprint
    again = client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=4, temperature=0)
    assert again.choices[0].token_ids == first.choices[0].token_ids


def test_every_response_has_headers(server):
    with server.client() as http:
        for method, path in (("GET", "/health"), ("GET", "/version"), ("GET", "/metrics"), ("GET", "/nope"),
                             ("GET", "/v1/models"), ("POST", "/v1/completions")):
            r = http.request(method, path)
            assert all(r.headers.get(h) for h in NUMERICS_HEADERS), (method, path, r.status_code)
            assert len(r.headers["x-request-id"]) >= 16


def test_seed_drawn_reported_and_replayed(client):
    raw = client.completions.with_raw_response.create(model=MODEL_NAME, prompt="what is", max_tokens=5,
                                                      temperature=0.9, logprobs=0)
    first = raw.parse()
    seed = int(raw.headers["x-samebits-seed"])
    assert first.model_extra["seed"] == seed
    replay = client.completions.create(model=MODEL_NAME, prompt="what is", max_tokens=5, temperature=0.9, seed=seed,
                                       logprobs=0)
    assert replay.choices[0].token_ids == first.choices[0].token_ids
    assert replay.choices[0].logprobs.token_logprobs == first.choices[0].logprobs.token_logprobs


def test_logprobs_float32_exact(client):
    r = client.completions.create(model=MODEL_NAME, prompt="hello", max_tokens=4, temperature=0.7, seed=11,
                                  logprobs=3)
    lp = r.choices[0].logprobs
    assert len(lp.token_logprobs) == len(r.choices[0].token_ids) == len(lp.tokens) == len(lp.top_logprobs)
    assert all(is_float32(v) and v <= 0 for v in lp.token_logprobs)
    # The 3 alternatives and the sampled token when it is not among them (OpenAI's and vLLM's k + 1).
    assert all(len(d) <= 4 and all(is_float32(v) for v in d.values()) for d in lp.top_logprobs)


def test_n_samples_differ_and_replay(client):
    kw = {"model": MODEL_NAME, "prompt": "the", "max_tokens": 6, "temperature": 1.0, "seed": 5, "n": 3}
    r = client.completions.create(**kw)
    assert [c.index for c in r.choices] == [0, 1, 2]
    ids = [tuple(c.token_ids) for c in r.choices]
    assert len(set(ids)) > 1
    assert [tuple(c.token_ids) for c in client.completions.create(**kw).choices] == ids


def test_prompt_forms(server, client):
    tok = server.engine.tokenizer
    ids = tok.encode("hello world")
    by_text = client.completions.create(model=MODEL_NAME, prompt="hello world", max_tokens=3, temperature=0)
    by_ids = client.completions.create(model=MODEL_NAME, prompt=ids, max_tokens=3, temperature=0)
    assert by_ids.choices[0].token_ids == by_text.choices[0].token_ids
    batch = client.completions.create(model=MODEL_NAME, prompt=[ids, ids[:2]], max_tokens=3, temperature=0, n=2)
    assert [c.index for c in batch.choices] == [0, 1, 2, 3]
    assert batch.choices[0].token_ids == by_text.choices[0].token_ids
    assert batch.usage.prompt_tokens == len(ids) + 2
    strings = client.completions.create(model=MODEL_NAME, prompt=["hello world", "the"], max_tokens=3, temperature=0)
    assert strings.choices[0].token_ids == by_text.choices[0].token_ids and len(strings.choices) == 2


def test_echo(client):
    r = client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=2, temperature=0, echo=True)
    plain = client.completions.create(model=MODEL_NAME, prompt="the cat", max_tokens=2, temperature=0)
    assert r.choices[0].text == "the cat" + plain.choices[0].text


def test_stop_string_cuts_text(client):
    kw = {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 8, "temperature": 0, "extra_body": {"ignore_eos": True}}
    full = client.completions.create(**kw).choices[0]
    text = full.text.rstrip("\ufffd")
    if len(text) < 3:
        pytest.skip("the random model produced too little text to cut")
    stop = text[1:3]
    cut = client.completions.create(stop=[stop], **kw).choices[0]
    assert cut.finish_reason == "stop" and cut.text == text[: text.find(stop)]


def _stream_concat(client, **kw):
    chunks = list(client.completions.create(stream=True, stream_options={"include_usage": True}, **kw))
    usage = chunks[-1].usage
    by_index: dict[int, dict] = {}
    for ch in chunks[:-1]:
        for c in ch.choices:
            acc = by_index.setdefault(c.index, {"text": "", "ids": [], "lps": [], "finish": None})
            acc["text"] += c.text
            acc["ids"] += c.model_extra["token_ids"]
            acc["lps"] += (c.logprobs.token_logprobs if c.logprobs else [])
            acc["finish"] = c.finish_reason or acc["finish"]
    return by_index, usage


def test_streaming_equals_non_streaming(client):
    kw = {"model": MODEL_NAME, "prompt": ["hello world", "the cat sat"], "max_tokens": 6, "temperature": 0.8,
          "seed": 3, "n": 2, "logprobs": 1}
    whole = client.completions.create(**kw)
    streamed, usage = _stream_concat(client, **kw)
    assert sorted(streamed) == [c.index for c in whole.choices]
    for c in whole.choices:
        s = streamed[c.index]
        assert (s["text"], s["ids"], s["lps"], s["finish"]) == (c.text, c.token_ids, c.logprobs.token_logprobs,
                                                                c.finish_reason)
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_chat_and_chat_stream(client):
    kw = {"model": MODEL_NAME, "messages": [{"role": "system", "content": "be brief"},
                                          {"role": "user", "content": "What is the capital of France?"}],
              "max_tokens": 5, "temperature": 0.5, "seed": 9, "logprobs": True, "top_logprobs": 2}
    whole = client.chat.completions.create(**kw)
    msg = whole.choices[0].message
    assert msg.role == "assistant" and whole.object == "chat.completion"
    content = whole.choices[0].logprobs.content
    assert len(content) == len(whole.choices[0].model_extra["token_ids"])
    assert all(is_float32(t.logprob) and len(t.top_logprobs) <= 2 for t in content)
    text, ids, lps = "", [], []
    for ch in client.chat.completions.create(stream=True, **kw):
        for c in ch.choices:
            text += c.delta.content or ""
            ids += c.model_extra.get("token_ids", [])
            lps += [t.logprob for t in (c.logprobs.content if c.logprobs else [])]
    assert (text, ids, lps) == (msg.content, whole.choices[0].model_extra["token_ids"], [t.logprob for t in content])


def test_chat_max_completion_tokens_and_n(client):
    r = client.chat.completions.create(model=MODEL_NAME, messages=[{"role": "user", "content": "hi"}],
                                       max_completion_tokens=3, n=2, seed=1, temperature=1.0,
                                       extra_body={"ignore_eos": True})
    assert [c.index for c in r.choices] == [0, 1]
    assert all(len(c.model_extra["token_ids"]) == 3 for c in r.choices)
    assert r.usage.completion_tokens == 6


def test_raw_sse_format(server):
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 2, "stream": True, "temperature": 0}
    with server.client() as http:
        r = http.post("/v1/completions", json=body)
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/event-stream")
    assert r.text.endswith("data: [DONE]\n\n") and r.headers.get("x-samebits-seed")
    assert all(e["object"] == "text_completion" for e in sse_events(r.text))


def test_models_version_health(server, client):
    assert [m.id for m in client.models.list().data] == [MODEL_NAME]
    assert client.models.retrieve(MODEL_NAME).id == MODEL_NAME
    with server.client() as http:
        v = http.get("/version").json()
        assert v["hash"] == http.get("/health").headers["x-samebits-fingerprint"] and v["samebits"]
        assert http.get("/health").json() == {"status": "ok"}


def test_streaming_with_stop_strings_equals_non_streaming(client):
    kw = {"model": MODEL_NAME, "prompt": "the cat", "max_tokens": 12, "temperature": 0,
          "extra_body": {"ignore_eos": True}}
    text = client.completions.create(**kw).choices[0].text.rstrip("\ufffd")
    if len(text) < 4:
        pytest.skip("the random model produced too little text to cut")
    stops = [text[2:4], "never-appears-" + text[:2]]
    whole = client.completions.create(stop=stops, **kw).choices[0]
    streamed, _ = _stream_concat(client, stop=stops, **kw)
    assert (streamed[0]["text"], streamed[0]["ids"], streamed[0]["finish"]) == (whole.text, whole.token_ids,
                                                                                whole.finish_reason)
    assert whole.finish_reason == "stop"


def test_request_id_echo_is_sanitised_and_charset_accepted(server):
    body = {"model": MODEL_NAME, "prompt": "hi", "max_tokens": 1}
    with server.client() as http:
        r = http.post("/v1/completions", json=body, headers={"X-Request-Id": "bad id\twith spaces"})
        assert r.status_code == 200 and r.headers["x-request-id"] != "bad id\twith spaces"
        r = http.post("/v1/completions", content=json.dumps(body).encode(),
                      headers={"content-type": "application/json; charset=utf-8", "X-Request-Id": "trace.42:a-b"})
        assert r.status_code == 200 and r.headers["x-request-id"] == "trace.42:a-b"
