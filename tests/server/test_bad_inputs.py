"""Every client mistake gets a 4xx with OpenAI error JSON naming the field, and the server stays healthy after it."""
from __future__ import annotations

import json

import pytest

from tests.server.conftest import MODEL_NAME

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


def c(**kw) -> dict:
    return {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2, **kw}


def ch(**kw) -> dict:
    return {"model": MODEL_NAME, "messages": MSGS, "max_tokens": 2, **kw}


def raw(body: str | bytes) -> bytes:
    return body.encode() if isinstance(body, str) else body


# (id, path, body: dict | bytes, extra headers, status, param or None, words the message must contain)
CASES = [
    ("max_tokens_zero", CMPL, c(max_tokens=0), {}, 400, "max_tokens", ["max_tokens", "1"]),
    ("max_tokens_negative", CMPL, c(max_tokens=-3), {}, 400, "max_tokens", ["max_tokens"]),
    ("max_tokens_over_context", CMPL, c(max_tokens=300), {}, 400, "max_tokens", ["256", "300", "completion"]),
    ("prompt_over_context", CMPL, c(prompt=[5] * 300), {}, 400, "prompt", ["256", "300"]),
    ("temperature_negative", CMPL, c(temperature=-0.5), {}, 400, "temperature", [">= 0"]),
    ("temperature_nan", CMPL, raw('{"model":"tiny","prompt":"x","temperature":NaN}'), {}, 400, "temperature",
     ["finite"]),
    ("temperature_string", CMPL, c(temperature="hot"), {}, 400, "temperature", ["number"]),
    ("top_p_zero", CMPL, c(top_p=0), {}, 400, "top_p", ["(0, 1]"]),
    ("top_p_above_one", CMPL, c(top_p=1.5), {}, 400, "top_p", ["(0, 1]"]),
    ("top_k_negative", CMPL, c(top_k=-5), {}, 400, "top_k", ["top_k"]),
    ("n_zero", CMPL, c(n=0), {}, 400, "n", ["[1, 16]"]),
    ("n_above_max", CMPL, c(n=17), {}, 400, "n", ["16", "17"]),
    ("n_float", CMPL, c(n=2.0), {}, 400, "n", ["integer"]),
    ("logprobs_above_20", CMPL, c(logprobs=21), {}, 400, "logprobs", ["20"]),
    ("logprobs_negative", CMPL, c(logprobs=-1), {}, 400, "logprobs", ["logprobs"]),
    ("empty_prompt_string", CMPL, c(prompt=""), {}, 400, "prompt", ["empty"]),
    ("empty_prompt_list", CMPL, c(prompt=[]), {}, 400, "prompt", ["empty"]),
    ("token_out_of_vocab", CMPL, c(prompt=[1, 99999]), {}, 400, "prompt", ["99999"]),
    ("token_negative", CMPL, c(prompt=[-1]), {}, 400, "prompt", ["-1"]),
    ("prompt_number", CMPL, c(prompt=123), {}, 400, "prompt", ["prompt"]),
    ("prompt_mixed_list", CMPL, c(prompt=[1, "a"]), {}, 400, "prompt", ["prompt"]),
    ("missing_model", CMPL, {"prompt": "x"}, {}, 400, "model", ["model"]),
    ("missing_prompt", CMPL, {"model": MODEL_NAME}, {}, 400, "prompt", ["prompt"]),
    ("unknown_model", CMPL, c(model="gpt-9"), {}, 404, "model", ["gpt-9"]),
    ("seed_negative", CMPL, c(seed=-1), {}, 400, "seed", ["seed"]),
    ("seed_too_big", CMPL, c(seed=2**64), {}, 400, "seed", ["seed"]),
    ("stop_empty_string", CMPL, c(stop=["ok", ""]), {}, 400, "stop", ["empty"]),
    ("stop_too_many", CMPL, c(stop=[f"s{i}" for i in range(17)]), {}, 400, "stop", ["16"]),
    ("stop_wrong_type", CMPL, c(stop=5), {}, 400, "stop", ["stop"]),
    ("stream_wrong_type", CMPL, c(stream="yes"), {}, 400, "stream", ["bool"]),
    ("max_tokens_bool", CMPL, c(max_tokens=True), {}, 400, "max_tokens", ["integer"]),
    ("presence_penalty_above_2", CMPL, c(presence_penalty=2.5), {}, 400, "presence_penalty", ["[-2.0, 2.0]"]),
    ("repetition_penalty_zero", CMPL, c(repetition_penalty=0), {}, 400, "repetition_penalty", ["> 0"]),
    ("min_tokens_above_max", CMPL, c(min_tokens=99, max_tokens=5), {}, 400, "min_tokens", ["max_tokens=5"]),
    ("logit_bias_key", CMPL, c(logit_bias={"cat": 10}), {}, 400, "logit_bias", ["'cat'"]),
    ("logit_bias_out_of_vocab", CMPL, c(logit_bias={"99999": 10}), {}, 400, "logit_bias", ["99999"]),
    ("logit_bias_above_100", CMPL, c(logit_bias={"5": 101}), {}, 400, "logit_bias", ["100"]),
    ("allowed_token_ids_out_of_vocab", CMPL, c(allowed_token_ids=[99999]), {}, 400, "allowed_token_ids", ["99999"]),
    # echo with logprobs is served on completions; chat's echo (vLLM: prepend the last message) is refused.
    ("chat_echo_with_logprobs", CHAT, ch(echo=True, logprobs=True), {}, 400, "echo", ["echo", "not supported"]),
    ("echo_logprobs_21", CMPL, c(echo=True, logprobs=21), {}, 400, "logprobs", ["20"]),
    ("prompt_logprobs_21", CMPL, c(prompt_logprobs=21), {}, 400, "prompt_logprobs", ["20"]),
    ("prompt_logprobs_negative", CMPL, c(prompt_logprobs=-1), {}, 400, "prompt_logprobs", ["[0, 20]"]),
    ("prompt_logprobs_bool", CMPL, c(prompt_logprobs=True), {}, 400, "prompt_logprobs", ["integer"]),
    ("prompt_logprobs_stream", CMPL, c(prompt_logprobs=0, stream=True), {}, 400, "prompt_logprobs", ["stream"]),
    ("chat_prompt_logprobs_stream", CHAT, ch(prompt_logprobs=1, stream=True), {}, 400, "prompt_logprobs",
     ["stream"]),
    ("max_tokens_zero_echo_negative", CMPL, c(max_tokens=-1, echo=True), {}, 400, "max_tokens", ["max_tokens"]),
    ("best_of_above_n", CMPL, c(best_of=3), {}, 400, "best_of", ["best_of"]),
    ("not_json", CMPL, raw("{not json"), {}, 400, None, ["JSON"]),
    ("invalid_utf8", CMPL, raw(b'{"model": "tiny", "prompt": "\xff\xfe"}'), {}, 400, None, []),
    ("json_array", CMPL, raw("[1, 2]"), {}, 400, None, []),
    ("json_null", CMPL, raw("null"), {}, 400, None, []),
    ("wrong_content_type", CMPL, raw(json.dumps(c())), {"content-type": "text/plain"}, 415, None, ["application/json"]),
    ("form_content_type", CMPL, raw("a=b"), {"content-type": "application/x-www-form-urlencoded"}, 415, None, []),
    ("body_too_large", CMPL, raw(json.dumps(c(prompt="x" * (5 * 1024 * 1024)))), {}, 413, None, ["bytes"]),
    ("chat_no_messages", CHAT, ch(messages=[]), {}, 400, "messages", ["at least one"]),
    ("chat_messages_not_list", CHAT, ch(messages="hi"), {}, 400, "messages", ["messages"]),
    ("chat_bad_role", CHAT, ch(messages=[{"role": "robot", "content": "x"}]), {}, 400, "messages", ["role"]),
    ("chat_image_part", CHAT, ch(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), {}, 400,
     "messages", ["text"]),
    ("chat_top_logprobs_21", CHAT, ch(logprobs=True, top_logprobs=21), {}, 400, "top_logprobs", ["20"]),
    ("chat_top_logprobs_alone", CHAT, ch(top_logprobs=2), {}, 400, "top_logprobs", ["logprobs"]),
    ("chat_max_completion_zero", CHAT, ch(max_completion_tokens=0), {}, 400, "max_completion_tokens", ["1"]),
    ("chat_max_tokens_over_context", CHAT, ch(max_tokens=1000), {}, 400, "max_tokens", ["256", "messages"]),
    ("chat_missing_messages", CHAT, {"model": MODEL_NAME}, {}, 400, "messages", ["messages"]),
    ("unknown_path", "/v1/embeddings", c(), {}, 404, None, ["/v1/embeddings"]),
]


def check_error(r, status: int, param, words) -> None:
    assert r.status_code == status, r.text
    body = r.json()
    assert set(body) == {"error"} and set(body["error"]) == {"message", "type", "param", "code"}, body
    err = body["error"]
    assert isinstance(err["message"], str) and err["message"] and isinstance(err["type"], str)
    if param is not None:
        assert err["param"] == param, err
    for w in words:
        assert w in err["message"], (w, err["message"])
    assert r.headers.get("x-samebits-fingerprint") and r.headers.get("x-request-id")


@pytest.mark.parametrize("name,path,body,headers,status,param,words", CASES, ids=[x[0] for x in CASES])
def test_bad_input(server, name, path, body, headers, status, param, words):
    with server.client() as http:
        if isinstance(body, bytes):
            r = http.post(path, content=body, headers={"content-type": "application/json", **headers})
        else:
            r = http.post(path, json=body, headers=headers)
        check_error(r, status, param, words)
        assert http.get("/health").status_code == 200


def test_case_count():
    assert len(CASES) >= 30


def test_wrong_method_and_header_limits(server):
    with server.client() as http:
        check_error(http.get(CMPL), 405, None, ["GET"])
        many = {f"x-h{i}": "v" for i in range(server.config.max_header_count + 1)}
        check_error(http.get("/v1/models", headers=many), 431, None, ["headers"])
        big = {"x-big": "a" * (server.config.max_header_bytes + 100)}
        check_error(http.get("/v1/models", headers=big), 431, None, ["large"])
        huge = {"x-huge": "a" * (3 * server.config.max_header_bytes)}
        assert 400 <= http.get("/v1/models", headers=huge).status_code < 500  # refused by h11 before the app
        assert http.get("/health").status_code == 200


def test_chunked_body_over_limit(server):
    def gen():
        for _ in range(6):
            yield b" " * (1024 * 1024)

    with server.client() as http:
        r = http.post(CMPL, content=gen(), headers={"content-type": "application/json"})
        check_error(r, 413, None, ["bytes"])
        assert http.get("/health").status_code == 200


def test_neutral_defaults_accepted_unknown_fields_refused(server):
    neutral = {"user": "me", "frequency_penalty": 0, "presence_penalty": 0.0, "logit_bias": {}, "tools": [],
               "tool_choice": "none", "n": 1, "metadata": {"a": "b"}, "response_format": {"type": "text"},
               "repetition_penalty": 1, "suffix": None}
    with server.client() as http:
        r = http.post(CMPL, json=c(temperature=0, **neutral))
        assert r.status_code == 200, r.text
        assert http.post(CMPL, json=c(temperature=0)).json()["choices"][0]["token_ids"] == \
            r.json()["choices"][0]["token_ids"]
        check_error(http.post(CMPL, json=c(some_future_field={"a": 1})), 400, "some_future_field",
                    ["some_future_field", "/v1/completions", "unknown"])
        check_error(http.post(CHAT, json=ch(temprature=0)), 400, "temprature", ["/v1/chat/completions"])


def test_bad_inputs_interleaved_with_good_ones_under_concurrency(server):
    import asyncio

    import httpx

    cases = [x for x in CASES if x[0] != "body_too_large"]  # 5 MB each would only slow the test down

    async def run():
        async with httpx.AsyncClient(base_url=server.url, timeout=60) as http:
            async def bad(case):
                _, path, body, headers, status, _, _ = case
                if isinstance(body, bytes):
                    r = await http.post(path, content=body, headers={"content-type": "application/json", **headers})
                else:
                    r = await http.post(path, json=body, headers=headers)
                return r.status_code, status

            async def good(i):
                r = await http.post(CMPL, json=c(prompt=f"hello {i}", max_tokens=3, temperature=0.5, seed=i))
                return r.status_code, 200

            jobs = [bad(x) for x in cases] + [good(i) for i in range(len(cases))]
            return await asyncio.gather(*jobs)

    results = asyncio.run(run())
    assert all(got == want for got, want in results), [r for r in results if r[0] != r[1]]
    assert server.healthy()
