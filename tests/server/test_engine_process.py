"""The engine-process backend (`--engine-process`, engine/engine_process.py) against the thread backend: the same
responses bit for bit (ids, logprob bits, text, drawn seeds), abort frees blocks, weight sync, and a killed child
fails requests with 503 instead of hanging and is restarted with the same fingerprint. One server pair for the module (a spawn costs seconds of imports), which
every test leaves as it found it whatever the order: each request that hits one server alone carries its seed, so the
servers' seed streams stay in step; the killed child is a server of its own."""
from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import json
import logging
import os
import signal
import time

import pytest
import torch

from samebits.engine.config import EngineConfig
from samebits.models.synthetic import write_tiny_checkpoint
from tests.server.conftest import MODEL_NAME, LiveServer

KEY = "k"
AUTH = {"Authorization": f"Bearer {KEY}"}
SEED = 7  # the servers' --seed: the stream seedless requests draw from
PROMPT = [5, 17, 42, 99, 7, 3]


def _live(config) -> LiveServer:
    from samebits.server.app import build_app
    from samebits.server.serve import ServerThread, build_async_engine

    async_engine = build_async_engine(config)
    app = build_app(async_engine, config)
    thread = ServerThread(app, config, stop_when_lost=True)  # as `serve` exits once the supervisor gives up
    return LiveServer(thread.url, app, async_engine, config, thread)


def _configs(model_dir, backends=(False, True), **more) -> list:
    from samebits.server.config import ServerConfig

    base = {"model": str(model_dir), "served_model_name": MODEL_NAME, "port": 0, "log_level": "warning",
            "device": "cpu", "max_num_seqs": 128, "max_model_len": 256, "seed": SEED, "api_keys": (KEY,), **more}
    return [ServerConfig.from_dict({**base, "engine_process": p}) for p in backends]


def _stop(servers) -> None:
    for s in servers:
        s.stop()
        s.async_engine.shutdown()


@pytest.fixture(scope="module")
def pair(tiny_model_dir):
    """(thread backend, process backend): one config apart, under the deployment template as `serve` runs them."""
    from samebits.server.serve import template

    configs = _configs(tiny_model_dir)
    with template(configs[0]), concurrent.futures.ThreadPoolExecutor(1) as pool:
        child = pool.submit(_live, configs[1])  # the child loads while this process builds the thread backend's
        servers = [_live(configs[0]), child.result()]
        yield servers
        _stop(servers)


@pytest.fixture
def doomed(tiny_model_dir):
    """A process backend of its own, for the test that kills its child: (server, seconds its engine took to load)."""
    from samebits.server.serve import template

    (config,) = _configs(tiny_model_dir, backends=(True,), max_engine_restarts=1)
    with template(config):
        start = time.monotonic()
        server = _live(config)
        yield server, time.monotonic() - start
        _stop([server])


def wait_for(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def _post(live: LiveServer, path: str, body: dict):
    with live.client() as http:
        return http.post(path, json=body, headers=AUTH)


def _strip(obj: dict) -> dict:
    return {k: v for k, v in obj.items() if k not in ("id", "created")}


def _merged(events: list[dict]) -> dict:
    """A stream's events joined per choice: how many steps one chunk holds depends on timing, what they hold not."""
    choices: dict[int, dict] = {}
    for e in events:
        for c in e["choices"]:
            into = choices.setdefault(c["index"], {})
            for key, value in {**c.pop("delta", {}), **c}.items():
                _join(into, key, value)
    return {"head": [_strip({k: v for k, v in e.items() if k != "choices"}) for e in events[:1]], "choices": choices}


def _join(into: dict, key: str, value) -> None:
    if isinstance(value, (str, list)) and key not in ("role", "finish_reason"):
        into[key] = into.get(key, value[:0]) + value
    elif isinstance(value, dict):
        for k, v in value.items():
            _join(into.setdefault(key, {}), k, v)
    elif value is not None or key not in into:
        into[key] = value


def _comparable(r) -> dict:
    """A response without what differs per call (ids, creation times): status, seed header, body or joined stream."""
    if r.headers.get("content-type", "").startswith("text/event-stream"):
        events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
        assert events[-1] == "[DONE]"
        body = _merged([json.loads(e) for e in events[:-1]])
    else:
        body = _strip(r.json())
    return {"status": r.status_code, "seed": r.headers.get("x-samebits-seed"), "body": body}


REQUESTS = [
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0.8, "seed": 3, "logprobs": 2}),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 12, "temperature": 0.9, "logprobs": 0, "stream": True}),
    ("/v1/completions", {"prompt": "hello world", "max_tokens": 10, "n": 2, "temperature": 1.0, "logprobs": 1}),
    ("/v1/completions", {"prompt": [PROMPT, PROMPT[:3]], "max_tokens": 8, "n": 2, "temperature": 1.0,
                         "stream": True, "stop": ["e", "a"]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 9, "temperature": 0.7,
                              "logprobs": True, "top_logprobs": 3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "yo"}], "max_tokens": 9, "temperature": 0.7,
                              "stream": True, "stop": "o"}),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 4, "echo": True, "logprobs": 1, "seed": 4}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3, "seed": 2,
                              "prompt_logprobs": 2}),
    ("/v1/completions", {"prompt": PROMPT, "max_tokens": 300}),  # refused the same way: 400 naming max_tokens
]


def _logprob_bits(body: dict) -> list[int]:
    values = body["choices"][0]["logprobs"]["token_logprobs"]
    return torch.tensor(values, dtype=torch.float32).view(torch.int32).tolist()


def test_process_backend_answers_bit_for_bit_as_the_thread_backend(pair):
    thread, process = pair
    answers = [[_comparable(_post(live, path, {"model": MODEL_NAME, **body})) for path, body in REQUESTS]
               for live in pair]
    for i, (a, b) in enumerate(zip(*answers)):
        assert a == b, REQUESTS[i]
    first = answers[1][0]
    assert first["status"] == 200 and _logprob_bits(first["body"]) == _logprob_bits(answers[0][0]["body"])
    assert answers[1][-1]["status"] == 400 and answers[1][-1]["body"]["error"]["param"] == "max_tokens"
    # Seedless requests drew from each server's stream under --seed, in the same order: the same seeds.
    drawn = [a["seed"] for a in answers[1][1:6]]
    assert len(set(drawn)) == 5 and drawn == [a["seed"] for a in answers[0][1:6]]
    assert process.engine.draw_seed() == thread.engine.draw_seed()  # the streams are still in step


def test_negative_control_another_seed_answers_otherwise(pair):
    path, body = REQUESTS[0]
    a = _comparable(_post(pair[0], path, {"model": MODEL_NAME, **body}))
    b = _comparable(_post(pair[1], path, {"model": MODEL_NAME, **body, "seed": 4}))
    assert a["status"] == b["status"] == 200 and a["body"]["choices"] != b["body"]["choices"]


def test_abort_mid_stream_frees_the_blocks(pair):
    process = pair[1]
    ae = process.async_engine
    aborted = ae.counters.requests_aborted
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 200, "temperature": 0.5, "stream": True,
            "ignore_eos": True, "seed": 1}
    with process.client() as http, http.stream("POST", "/v1/completions", json=body, headers=AUTH) as r:
        assert r.status_code == 200
        next(r.iter_lines())  # the first chunk: the request runs and holds blocks
        wait_for(lambda: ae.stats.num_running == 1 and ae.stats.kv_usage > 0)
    wait_for(lambda: ae.counters.requests_aborted == aborted + 1)
    wait_for(lambda: ae.stats.num_running == 0 and ae.stats.kv_usage == 0)
    after = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 3, "seed": 1}
    assert _post(process, "/v1/completions", after).status_code == 200


def test_closures_cannot_cross_and_unknown_commands_are_refused(pair):
    ae = pair[1].async_engine
    with pytest.raises(TypeError, match="only named commands cross"):
        asyncio.run(ae.call(lambda engine: engine.stats()))
    with pytest.raises(ValueError, match="unknown engine command 'reset'.*update_weights"):
        asyncio.run(ae.command("reset"))


def test_update_weights_through_the_engine_process(pair, tmp_path):
    new = write_tiny_checkpoint(tmp_path / "new", "llama3", seed=5)
    path, body = REQUESTS[0]
    before = _comparable(_post(pair[1], path, {"model": MODEL_NAME, **body}))
    synced = [_post(live, "/admin/update_weights", {"path": str(new), "version": "step-1"}) for live in pair]
    assert [r.status_code for r in synced] == [200, 200] and synced[0].json() == synced[1].json()
    after = [_comparable(_post(live, path, {"model": MODEL_NAME, **body})) for live in pair]
    assert after[0] == after[1] and after[1]["body"] != before["body"]
    assert after[1]["body"]["system_fingerprint"] == synced[1].json()["fingerprint"]
    narrow = write_tiny_checkpoint(tmp_path / "narrow", "llama3", seed=5, intermediate_size=128)
    refused = _post(pair[1], "/admin/update_weights", {"path": str(narrow)})
    assert refused.status_code == 400 and "old weights kept" in refused.json()["error"]["message"]


def _kill_mid_stream(live: LiveServer) -> tuple[list[str], float]:
    """SIGKILL the engine process while a stream runs; the stream's events and the time of the kill."""
    body = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 200, "stream": True, "ignore_eos": True}
    with live.client(timeout=30) as http, http.stream("POST", "/v1/completions", json=body, headers=AUTH) as r:
        lines = r.iter_lines()
        next(lines)
        os.kill(live.async_engine.process.pid, signal.SIGKILL)
        killed = time.monotonic()
        return [ln.removeprefix("data: ") for ln in lines if ln], killed


def test_a_killed_engine_process_is_restarted_with_the_same_fingerprint(doomed, pair, caplog, monkeypatch):
    """SIGKILL of the engine process: the stream ends with engine_dead, one line is logged, the gauges are zero,
    /health says starting (alive) and /ready 503 while a new process loads, which then serves the same bits under
    the same fingerprint, within its load time. Killed again past --max-engine-restarts=1, the server stops (`serve`
    exits with status 1). A restart whose fingerprint differs from the one served (after a weight update, which a
    restart does not bring back) is refused."""
    live, load_s = doomed
    ae, supervisor = live.async_engine, live.app.state.samebits.supervisor
    seeded = {"model": MODEL_NAME, "prompt": PROMPT, "max_tokens": 6, "temperature": 0.8, "seed": 3, "logprobs": 1}
    before = _post(live, "/v1/completions", seeded).json()
    with caplog.at_level(logging.INFO, "samebits.server"):
        events, killed = _kill_mid_stream(live)
        assert events[-1] == "[DONE]" and json.loads(events[-2])["error"]["code"] == "engine_dead"
        wait_for(lambda: supervisor.status == "starting", 5)
        deaths = [r.getMessage() for r in caplog.records if "died" in r.getMessage()]
        assert len(deaths) == 1 and "exit code -9" in deaths[0] and "restart 1 of at most 1" in deaths[0], deaths
        assert ae.stats.num_running == 0 and ae.stats.kv_usage == 0, "the dead engine's gauges are zeroed"
        with live.client() as http:
            assert http.get("/health").json() == {"status": "starting", "restarts": 0}
            assert http.get("/ready").status_code == 503
            r = http.post("/v1/completions", json=seeded, headers=AUTH)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
        wait_for(lambda: supervisor.status == "ok", 120)
        # Serving again as soon as the new process has loaded (no back-off): from the kill to "ok" is the restart's
        # own spawn and load, which on an idle machine is the first load's (on a shared CPU it varies, so the bound
        # is loose).
        waited = time.monotonic() - killed
        assert waited < supervisor.last_restart_s + 3 and supervisor.last_restart_s < 4 * load_s + 10, (
            waited, supervisor.last_restart_s, load_s)
    after = _post(live, "/v1/completions", seeded)
    assert after.status_code == 200 and _strip(after.json()) == _strip(before), "same fingerprint, same bits"
    with live.client() as http:
        assert http.get("/ready").status_code == 200 and http.get("/health").json() == {"status": "ok"}
        assert f'samebits:engine_restarts_total{{model_name="{MODEL_NAME}"}} 1.0' in http.get("/metrics").text
    _kill_mid_stream(live)
    wait_for(lambda: supervisor.gave_up is not None, 30)
    assert "after 1 restart(s)" in supervisor.gave_up and supervisor.status == "engine_dead"
    live.thread.thread.join(60)
    assert not live.thread.thread.is_alive(), "the server stopped, as `serve` exits with status 1"
    assert pair[0].healthy()  # the negative control: the thread backend's server serves on
    # The fingerprint check itself, on the dead engine (as before the server shut it down), with a child that comes
    # back as another identity.
    from samebits.engine.engine_process import IdentityChanged

    ready = (None, None, {**ae.engine.fingerprint(), "weights": "base"}, ae.stats)
    monkeypatch.setattr(ae, "_spawn", lambda: ready)
    monkeypatch.setattr(ae, "_stopping", False)
    ae.engine._fingerprint = {**ae.engine.fingerprint(), "weights": "step-1"}  # what update_weights leaves
    with pytest.raises(IdentityChanged, match="weights: served 'step-1', restarted 'base'"):
        ae.restart()


def test_a_child_that_dies_while_loading_fails_the_constructor(tiny_model_dir):
    from samebits.engine.engine_process import EngineProcessError, ProcessAsyncEngine

    config = EngineConfig(model=str(tiny_model_dir), device="cpu", max_model_len=256)
    with pytest.raises(EngineProcessError, match=r"exited while loading \(exit code 3\)"):
        # `loaded` runs first in the child; a partial of os._exit pickles by reference (a function of this module
        # would not: the child cannot import the tests).
        ProcessAsyncEngine(config, functools.partial(os._exit, 3), start_timeout_s=120)


def test_engine_process_config_is_checked():
    from samebits.engine.engine_process import ProcessAsyncEngine
    from samebits.server.config import ServerConfig

    with pytest.raises(ValueError, match="engine_process must be None or a bool, got 1"):
        ServerConfig(engine_process=1)
    with pytest.raises(ValueError, match="engine_process needs tensor_parallel_size=1, got 2"):  # before any spawn
        ProcessAsyncEngine(EngineConfig(tensor_parallel_size=2))


def test_engine_process_defaults_to_the_process_on_cuda_at_one_rank_only():
    """None (the default) picks the process for a CUDA engine at tensor_parallel_size 1 and the thread on the CPU or
    with ranks; an explicit value is kept either way."""
    from samebits.server.config import ServerConfig

    auto = ServerConfig()
    assert auto.engine_process is None
    assert auto.uses_engine_process("cuda") and auto.uses_engine_process("cuda:1")
    assert not auto.uses_engine_process("cpu")
    ranks = ServerConfig.from_dict({"tensor_parallel_size": 2})
    assert not ranks.uses_engine_process("cuda")
    for value in (True, False):
        assert ServerConfig(engine_process=value).uses_engine_process("cpu") is value
        assert ServerConfig(engine_process=value).uses_engine_process("cuda") is value
