"""API keys, ServerConfig validation, the serve command's flags, and the deterministic-template refusal."""
from __future__ import annotations

import dataclasses
import pathlib
import re

import openai
import pytest
from typer.testing import CliRunner

from samebits.engine.config import EngineConfig
from samebits.server.config import ServerConfig
from samebits.server.middleware import key_matches
from tests.server.conftest import MODEL_NAME, make_engine, start_server
from tests.server.fake_engine import FakeLLMEngine

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
            assert r.json()["error"]["code"] == "invalid_api_key" and r.headers["x-request-id"]
            # Versions and kernel flags are for clients holding a key (issue 20, item 9).
            assert not [k for k in r.headers if k.startswith("x-samebits-")], r.headers


def test_right_keys_work_and_probes_stay_open(locked):
    for key in KEYS:
        client = openai.OpenAI(base_url=f"{locked.url}/v1", api_key=key, max_retries=0)
        # A sampled token may decode to "" (a special token): count tokens, not characters.
        resp = client.completions.create(model=MODEL_NAME, prompt="x", max_tokens=2)
        assert resp.usage.completion_tokens >= 1 and resp.choices[0].finish_reason in ("length", "stop")
    with locked.client() as http:
        assert http.get("/health").status_code == 200
        assert http.get("/metrics").status_code == 200


def test_keys_from_the_environment_and_a_key_file_need_no_argv(monkeypatch, tmp_path):
    """SAMEBITS_API_KEY and --api-key-file each give an accepted key (neither shows in `ps`); probes stay open.
    Control: the environment's key is not accepted by a server started without it."""
    keys = tmp_path / "keys.txt"
    keys.write_text("# rotated monthly\nfile-key\n\n")
    monkeypatch.setenv("SAMEBITS_API_KEY", "env-key")
    live = start_server(FakeLLMEngine(), api_key_file=str(keys))
    monkeypatch.delenv("SAMEBITS_API_KEY")
    control = start_server(FakeLLMEngine(), api_key_file=str(keys))
    try:
        for server, accepted in ((live, {"env-key", "file-key"}), (control, {"file-key"})):
            with server.client() as http:
                for key in ("env-key", "file-key", "other"):
                    r = http.get("/v1/models", headers={"Authorization": f"Bearer {key}"})
                    assert r.status_code == (200 if key in accepted else 401), (key, r.text)
                assert http.get("/v1/models").status_code == 401 and http.get("/health").status_code == 200
    finally:
        live.stop()
        control.stop()


@pytest.mark.parametrize("content, match", [(None, "cannot read"), ("# only a comment\n\n", "holds no key")])
def test_a_key_file_that_gives_no_key_is_refused_at_start(tmp_path, content, match):
    path = tmp_path / "keys.txt"
    if content is not None:
        path.write_text(content)
    with pytest.raises(ValueError, match=f"api_key_file: .*{match}"):
        ServerConfig(api_key_file=str(path))


def test_key_matches_constant_time_helper():
    keys = tuple(k.encode() for k in KEYS)
    assert key_matches(b"key-two", keys) and not key_matches(b"key-tw", keys) and not key_matches(None, keys)


@pytest.mark.parametrize("bad", [{"port": 70000}, {"port": -1}, {"host": "example.com"}, {"max_n": 0},
                                 {"max_body_bytes": 0}, {"api_keys": ["a"]}, {"api_keys": ("",)},
                                 {"max_logprobs": -1}])
def test_server_config_rejects(bad):
    with pytest.raises(ValueError):
        ServerConfig(**bad)


@pytest.mark.parametrize("bad", [{"mode": "turbo"}, {"max_waiting": -1}, {"model": ""}, {"max_model_len": 0},
                                 {"max_num_seqs": True}, {"port": 70000}, {"api_keys": [""]}, {"log_level": "loud"}])
def test_server_config_from_flat_fields_rejects(bad):
    field = next(iter(bad))
    with pytest.raises(ValueError, match=field):
        ServerConfig.from_dict(bad)


@pytest.mark.parametrize("bad", [{"engine": {"model": "x"}}, {"engine": EngineConfig()}])
def test_server_config_needs_an_engine_config_with_a_bounded_queue(bad):
    with pytest.raises(ValueError, match="engine must be an EngineConfig|max_waiting must be set"):
        ServerConfig(**bad)


def test_server_config_defaults_frozen_and_unknown_keys():
    cfg = ServerConfig()
    assert cfg.host == "127.0.0.1" and cfg.engine.mode == "deterministic" and cfg.max_n == 16 and cfg.api_keys == ()
    assert cfg.engine.max_waiting == 256 and cfg.model_name == cfg.engine.model == "smollm2-135m"
    with pytest.raises(dataclasses.FrozenInstanceError):
        cfg.port = 1
    with pytest.raises(ValueError, match="unknown ServerConfig keys: colour"):
        ServerConfig.from_dict({"colour": "blue"})
    assert ServerConfig.from_dict({"api_keys": ["k"]}).api_keys == ("k",)


def test_server_fields_do_not_shadow_engine_fields():
    server = {f.name for f in dataclasses.fields(ServerConfig)}
    assert not server & {f.name for f in dataclasses.fields(EngineConfig)}


def test_serve_flags_map_one_to_one_to_config_fields():
    import inspect

    from samebits.cli import app

    command = next(c for c in app.registered_commands if c.callback.__name__ == "serve")
    params = set(inspect.signature(command.callback).parameters)
    engine = {f.name for f in dataclasses.fields(EngineConfig)}
    # Besides the fields: typer's context and the positional MODEL (`serve MODEL` as `vllm serve MODEL`).
    assert params == ({f.name for f in dataclasses.fields(ServerConfig)} - {"engine"}) | engine | {"ctx", "model_arg"}


# A value other than the default for every field, and the flags that set it.
NON_DEFAULT_FLAGS = {
    "model": ["--model", "m"], "mode": ["--mode", "fast"], "policy": ["--policy", "bucketed"],
    "device": ["--device", "cpu"], "dtype": ["--dtype", "bfloat16"], "max_num_seqs": ["--max-num-seqs", "8"],
    "max_num_batched_tokens": ["--max-num-batched-tokens", "64"], "max_model_len": ["--max-model-len", "128"],
    "block_size": ["--block-size", "32"], "kv_cache_tokens": ["--kv-cache-tokens", "4096"],
    "enable_prefix_caching": ["--no-enable-prefix-caching"], "cuda_graphs": ["--no-cuda-graphs"],
    "async_scheduling": ["--no-async-scheduling"],
    "seed": ["--seed", "7"], "max_waiting": ["--max-waiting", "5"],
    "tensor_parallel_size": ["--tensor-parallel-size", "2"], "all_reduce": ["--all-reduce", "native"],
    "quantization": ["--quantization", "fp8"],
    "host": ["--host", "0.0.0.0"], "port": ["--port", "9"], "api_keys": ["--api-key", "a", "--api-key", "b"],
    "served_model_name": ["--served-model-name", "s"], "max_n": ["--max-n", "2"], "max_logprobs": ["--max-logprobs", "3"],
    "max_prompts": ["--max-prompts", "4"], "max_stop": ["--max-stop", "5"], "max_body_bytes": ["--max-body-bytes", "6"],
    "max_header_count": ["--max-header-count", "7"], "max_header_bytes": ["--max-header-bytes", "8"],
    "timeout_keep_alive": ["--timeout-keep-alive", "9"], "log_level": ["--log-level", "debug"],
    "max_prompt_chars": ["--max-prompt-chars", "10"], "max_waiting_tokens": ["--max-waiting-tokens", "11"],
    "default_max_tokens": ["--default-max-tokens", "12"], "allow_special_tokens": ["--allow-special-tokens"],
    "timeout_header": ["--timeout-header", "1.5"], "timeout_body": ["--timeout-body", "2.5"],
    "max_connections": ["--max-connections", "13"], "engine_process": ["--engine-process"],
    "tool_call_parser": ["--tool-call-parser", "hermes"],
    "gpu_memory_utilization": ["--gpu-memory-utilization", "0.5"], "enforce_eager": ["--enforce-eager"],
    "chat_template": ["--chat-template", "{{ messages[0]['content'] }}"],
    "disable_log_requests": ["--disable-log-requests"], "trust_remote_code": ["--trust-remote-code"],
    "data_parallel_backend": ["--data-parallel-backend", "ray"], "ray_address": ["--ray-address", "auto"],
    "long_prefill_token_threshold": ["--long-prefill-token-threshold", "0"],
    "max_num_partial_prefills": ["--max-num-partial-prefills", "3"],
    "max_long_partial_prefills": ["--max-long-partial-prefills", "2"], "timeout_write": ["--timeout-write", "3.5"],
    "api_key_file": ["--api-key-file", "keys.txt"], "max_engine_restarts": ["--max-engine-restarts", "0"],
}
# Fields whose non-default value the ones above exclude (several replicas and speculation need tensor_parallel_size=1,
# speculation the dynamic policy): a second run.
OTHER_FLAGS = {"data_parallel_size": ["--data-parallel-size", "2"],
               "speculative_config": ["--speculative-config", '{"method": "ngram", "num_speculative_tokens": 3}']}


def _serve_config(monkeypatch, flags: dict):
    import samebits.server.serve as serve_mod
    from samebits.cli import app

    seen = []
    monkeypatch.setattr(serve_mod, "serve", seen.append)
    result = CliRunner().invoke(app, ["serve", *[a for f in flags.values() for a in f]])
    assert result.exit_code == 0, result.output
    return seen[0]


def test_every_config_field_is_reachable_from_serve_flags(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "keys.txt").write_text("# the key file\nk1\n")
    fields = {f.name for f in dataclasses.fields(ServerConfig)} - {"engine"}
    assert set(NON_DEFAULT_FLAGS) | set(OTHER_FLAGS) == fields | {f.name for f in dataclasses.fields(EngineConfig)}
    default = ServerConfig()
    for flags in (NON_DEFAULT_FLAGS, OTHER_FLAGS):
        config = _serve_config(monkeypatch, flags)
        for name in flags:
            holder, base = (config.engine, default.engine) if name not in fields else (config, default)
            assert getattr(holder, name) != getattr(base, name), name
    config = _serve_config(monkeypatch, NON_DEFAULT_FLAGS)
    assert config.api_keys == ("a", "b") and config.engine.block_size == 32 and config.engine.seed == 7


def test_serve_refuses_when_the_template_cannot_be_applied(monkeypatch, tiny_model_dir):
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
    result = CliRunner().invoke(app, ["serve", "--model", str(tiny_model_dir), "--port", "0"])  # 0: whatever 8000 holds
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
