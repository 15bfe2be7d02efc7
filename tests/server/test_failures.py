"""Failure injection on the FakeLLMEngine: a full waiting queue, the engine loop dying before and mid-stream."""
from __future__ import annotations

import asyncio
import json
import threading
import time

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, start_server
from tests.server.fake_engine import FakeLLMEngine

REQ = {"model": MODEL_NAME, "prompt": "abc", "max_tokens": 3}


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


@pytest.fixture
def gated():
    engine = FakeLLMEngine()
    engine.gate = threading.Event()
    live = start_server(engine, max_waiting=3)
    yield live
    engine.gate.set()
    live.stop()


def test_full_queue_gets_429_and_recovers(gated):
    async def flood():
        async with httpx.AsyncClient(base_url=gated.url, timeout=30) as http:
            tasks = [asyncio.ensure_future(http.post("/v1/completions", json=REQ)) for _ in range(3)]
            await asyncio.to_thread(wait_for, lambda: gated.async_engine.num_waiting == 3)
            refused = await http.post("/v1/completions", json=REQ)
            gated.engine.gate.set()
            return refused, await asyncio.gather(*tasks)

    refused, admitted = asyncio.run(flood())
    assert refused.status_code == 429
    err = refused.json()["error"]
    assert err["code"] == "queue_full" and "3" in err["message"]
    assert [r.status_code for r in admitted] == [200, 200, 200]
    assert gated.healthy()
    with gated.client() as http:
        assert http.post("/v1/completions", json=REQ).status_code == 200
        assert f'samebits:requests_rejected_queue_full_total{{model_name="{MODEL_NAME}"}} 1.0' in http.get("/metrics").text


def test_engine_death_before_first_token_is_503_and_health_503():
    engine = FakeLLMEngine()
    engine.fail_at_step = 1
    live = start_server(engine)
    try:
        with live.client() as http:
            r = http.post("/v1/completions", json=REQ)
            assert r.status_code == 503 and r.json()["error"]["code"] == "engine_dead"
            health = http.get("/health")
            assert health.status_code == 503 and health.json()["error"]["code"] == "engine_dead"
            assert http.post("/v1/completions", json=REQ).status_code == 503
            assert http.get("/metrics").status_code == 200  # still scrapeable: that is how the death is noticed
    finally:
        live.stop()


def test_engine_death_mid_stream_is_error_event_then_done():
    engine = FakeLLMEngine(step_delay_s=0.02)
    engine.fail_at_step = 3
    live = start_server(engine)
    try:
        with live.client() as http:
            r = http.post("/v1/completions", json={**REQ, "max_tokens": 50, "stream": True})
            assert r.status_code == 200
            events = [e.removeprefix("data: ") for e in r.text.split("\n\n") if e]
            assert events[-1] == "[DONE]"
            last = json.loads(events[-2])
            assert last["error"]["code"] == "engine_dead" and set(last["error"]) == {"message", "type", "param",
                                                                                   "code"}
            assert any(json.loads(e).get("choices") for e in events[:-2])
            assert http.get("/health").status_code == 503
    finally:
        live.stop()
