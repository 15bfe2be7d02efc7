"""API keys, ServerConfig validation, the serve command's flags, and the deterministic-template refusal."""
from __future__ import annotations

import dataclasses
import pathlib
import re

import openai
import pytest
from typer.testing import CliRunner

from samebits.server.config import ServerConfig
from samebits.server.middleware import key_matches
from tests.server.conftest import MODEL_NAME, make_engine, start_server

KEYS = ("key-one", "key-two")


@pytest.fixture(scope="module")
def locked(tiny_model_dir):
    live = start_server(make_engine(tiny_model_dir), api_keys=KEYS)
    yield live
    live.stop()


@pytest.mark.parametrize("headers", [{}, {"Authorization": "Bearer nope"}, {"Authorization": "key-one"},
                                     {"Authorization": "Bearer key-on"}, {"Authorization": "Basic key-one"}])
def test_missing_or_wrong_key_is_401(locked, headers):
    with locked.client() as http:
        for method, path in (("POST", "/v1/completions"), ("GET", "/v1/models"), ("GET", "/version")):
            r = http.request(method, path, headers=headers, json={"model": MODEL_NAME, "prompt": "x"})
            assert r.status_code == 401, (path, headers)
            assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["x-samebits-fingerprint"]


def test_right_keys_work_and_probes_stay_open(locked):
    for key in KEYS:
        client = openai.OpenAI(base_url=f"{locked.url}/v1", api_key=key, max_retries=0)
        # A sampled token may decode to "" (a special token): count tokens, not characters.
        resp = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2)
        assert resp.usage.completion_tokens >= 1 and resp.choices[0].finish_reason in ("length", "stop")
    with locked.client() as http:
        assert http.get("/health").status_code == 200
        assert http.get("/metrics").status_code == 200


def test_key_matches_constant_time_helper():
    keys = tuple(k.encode() for k in KEYS)
    assert key_matches(b"key-two", keys) and not key_matches(b"key-tw", keys) and not key_matches(None, keys)


@pytest.mark.parametrize("bad", [{"port": 70000}, {"port": -1}, {"host": "example.com"}, {"mode": "turbo"},
                                 {"max_n": 0}, {"max_waiting": -1}, {"max_body_bytes": 0}, {"model": ""},
                                 {"api_keys": ["a"]}, {"api_keys": ("",)}, {"max_logprobs": -1},
                                 {"max_model_len": 0}, {"max_num_seqs": True}])
def test_server_config_rejects(bad):
    with pytest.raises(ValueError):
        ServerConfig(**bad)


def test_server_config_defaults_frozen_and_unknown_keys():
    cfg = ServerConfig()
    assert cfg.host == "127.0.0.1" and cfg.mode == "deterministic" and cfg.max_n == 16 and cfg.api_keys == ()
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.port = 1
    with pytest.raises(ValueError, match="unknown ServerConfig keys: colour"):
        ServerConfig.from_dict({"colour": "blue"})
    assert ServerConfig.from_dict({"api_keys": ["k"]}).api_keys == ("k",)


def test_serve_flags_map_one_to_one_to_config_fields():
    from samebits.cli import app

    command = next(c for c in app.registered_commands if c.callback.__name__ == "serve")
    import inspect

    params = set(inspect.signature(command.callback).parameters)
    assert params == {f.name for f in dataclasses.fields(ServerConfig)}


def test_serve_refuses_when_the_template_cannot_be_applied(monkeypatch):
    import samebits.server.serve as serve_mod
    from samebits import runtime
    from samebits.cli import app
    from samebits.runtime import RuntimeTemplateError

    def broken():
        raise RuntimeTemplateError("CUDA is already initialised and CUBLAS_WORKSPACE_CONFIG was <unset>")

    def no_engine(config):
        raise AssertionError("the engine must not be built when the template failed")

    monkeypatch.setattr(runtime, "deterministic_runtime", broken)
    monkeypatch.setattr(serve_mod, "build_async_engine", no_engine)
    result = CliRunner().invoke(app, ["serve", "--model", "x"])
    assert result.exit_code == 2
    assert "deterministic" in result.output and "CUBLAS_WORKSPACE_CONFIG" in result.output


def test_serve_rejects_bad_flags_with_one_line():
    from samebits.cli import app

    result = CliRunner().invoke(app, ["serve", "--max-n", "0"])
    assert result.exit_code == 2 and "max_n must be a positive integer" in result.output


def test_no_code_bearing_serialisation():
    root = pathlib.Path(__file__).resolve().parents[2]
    files = list((root / "samebits" / "server").glob("*.py")) + [root / "samebits" / "engine" / "async_engine.py"]
    for f in files:
        banned = r"^\s*(import|from)\s+(pickle|marshal|dill|cloudpickle|shelve)\b"
        assert not re.search(banned, f.read_text(), re.MULTILINE), f
