"""The HTTP error's `param` is the field the error carries (samebits/errors.py FieldError), for every raiser a
request reaches; an error that carries none gets a null `param`, whatever its message begins with."""
from __future__ import annotations

import pytest

from samebits.engine.async_engine import RequestTooLarge
from samebits.engine.prompts import normalize_prompts
from samebits.engine.sampling_params import SamplingParams, check_context_length, check_vocab
from samebits.modes import check_mode
from samebits.server.errors import map_error
from samebits.structured.grammar import GrammarError
from samebits.structured.params import StructuredOutputsParams
from tests.server.conftest import MODEL_NAME

CMPL, CHAT = "/v1/completions", "/v1/chat/completions"
MSGS = [{"role": "user", "content": "hi"}]


def c(**kw) -> dict:
    return {"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2, **kw}


def ch(**kw) -> dict:
    return {"model": MODEL_NAME, "messages": MSGS, "max_tokens": 2, **kw}


# (id, path, body, param): one bad request per raiser the server reaches.
REQUESTS = [
    ("sampling_params", CMPL, c(top_p=1.5), "top_p"),
    ("sampling_params_stop", CMPL, c(stop=["ok", ""]), "stop"),
    ("check_seed", CMPL, c(seed=-1), "seed"),
    ("check_prompt", CMPL, c(prompt=[1, 99999]), "prompt"),
    ("context_length", CMPL, c(max_tokens=300), "max_tokens"),
    ("check_vocab", CMPL, c(allowed_token_ids=[99999]), "allowed_token_ids"),
    ("render_chat", CHAT, ch(continue_final_message=True, add_generation_prompt=True), "continue_final_message"),
    ("chat_template_kwargs", CHAT, ch(chat_template_kwargs={"add_generation_prompt": True}), "chat_template_kwargs"),
    ("message_text", CHAT, ch(messages=[{"role": "user", "content": [{"type": "image_url"}]}]), "messages"),
]


@pytest.mark.parametrize(("path", "body", "param"), [r[1:] for r in REQUESTS], ids=[r[0] for r in REQUESTS])
def test_param_is_the_field_the_error_carries(server, path, body, param):
    with server.client() as client:
        r = client.post(path, json=body)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param


def test_request_too_large_names_its_field(server, monkeypatch):
    monkeypatch.setattr(server.async_engine, "max_waiting", 1)
    with server.client() as client:
        r = client.post(CMPL, json=c(n=2))
    assert r.status_code == 400 and r.json()["error"]["param"] == "n", r.text


def test_plain_value_error_has_no_param(server, monkeypatch):
    """Negative control: a message that begins with a field's name is not read as one (the regex this replaced
    would have answered "prompt")."""
    def refuse(*args, **kwargs):
        raise ValueError("prompt is refused by a plain ValueError")

    monkeypatch.setattr(server.engine, "validate", refuse)
    with server.client() as client:
        r = client.post(CMPL, json=c())
    assert r.status_code == 400
    assert r.json()["error"] == {"message": "prompt is refused by a plain ValueError", "type": "invalid_request_error",
                                 "param": None, "code": None}


def _raised(make) -> BaseException:
    with pytest.raises(ValueError) as e:
        make()
    return e.value


# Raisers the HTTP cases above do not reach by themselves: map_error keeps the message and reads the field.
RAISERS = [
    (lambda: SamplingParams(temperature=-1.0), "temperature"),
    (lambda: SamplingParams(presence_penalty=3.0), "presence_penalty"),
    (lambda: check_mode("turbo"), "mode"),
    (lambda: check_context_length(300, 1, 256), "prompt"),
    (lambda: check_vocab(SamplingParams(logit_bias={99999: 1.0}), 100), "logit_bias"),
    (lambda: normalize_prompts({"text": "x"}, list), "prompt"),
    (lambda: StructuredOutputsParams(regex="a", choice=["b"]), "structured_outputs"),
    (lambda: (_ for _ in ()).throw(GrammarError("regex", "unclosed group")), "structured_outputs"),
    (lambda: (_ for _ in ()).throw(RequestTooLarge("max_tokens", "max_tokens: the request holds 9 tokens")),
     "max_tokens"),
]


@pytest.mark.parametrize(("make", "field"), RAISERS, ids=[f for _, f in RAISERS])
def test_map_error_reads_the_field(make, field):
    e = _raised(make)
    err = map_error(e)
    assert (err.status, err.param, err.message) == (400, field, str(e))


def test_map_error_plain_value_error_and_others():
    assert map_error(ValueError("top_p looks wrong")).param is None
    assert map_error(RuntimeError("top_p")).status == 500
