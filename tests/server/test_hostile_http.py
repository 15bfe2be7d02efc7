"""Trust boundaries and HTTP edges: nothing about versions before the key, the served name hides the real one, echoed
values are cut, CL+TE is refused, HEAD wherever GET and Allow on 405, duplicate JSON keys and loose logit_bias keys
refused, every error OpenAI JSON with the request id, and gauges follow an abort within one step."""
from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from urllib.parse import urlparse

import pytest

from samebits.engine.async_engine import AsyncEngine
from samebits.engine.sampling_params import SamplingParams
from tests.server.conftest import start_server
from tests.server.fake_engine import FakeLLMEngine

KEY = "secret-key"
SERVED = "public-name"
REAL = "tiny"  # conftest's model name: the engine's `model` field, which --served-model-name hides


@pytest.fixture(scope="module")
def locked():
    live = start_server(FakeLLMEngine(), api_keys=(KEY,), served_model_name=SERVED)
    yield live
    live.stop()


def numerics(r) -> list[str]:
    return [k for k in r.headers if k.startswith("x-samebits-")]


def test_no_version_headers_before_the_key(locked):
    auth = {"Authorization": f"Bearer {KEY}"}
    with locked.client() as http:
        for path in ("/health", "/metrics", "/v1/models", "/nope"):
            assert not numerics(http.get(path)), path
        too_many = {f"x-h{i}": "v" for i in range(locked.config.max_header_count + 1)}
        assert http.get("/health", headers=too_many).status_code == 431
        assert not numerics(http.get("/health", headers=too_many))
        # With the key, the same responses carry them (the control: they exist and are only withheld).
        r = http.get("/v1/models", headers=auth)
        assert r.status_code == 200 and "x-samebits-fingerprint" in numerics(r)
        assert "x-samebits-fingerprint" in numerics(http.get("/health", headers=auth))


def test_the_served_name_hides_the_real_one(locked):
    auth = {"Authorization": f"Bearer {KEY}"}
    with locked.client(headers=auth) as http:
        listing = http.get("/v1/models").text
        assert SERVED in listing and f'"{REAL}"' not in listing
        assert http.get(f"/v1/models/{SERVED}").status_code == 200
        assert http.get(f"/v1/models/{REAL}").status_code == 404
        r = http.post("/v1/completions", json={"model": REAL, "prompt": "x", "max_tokens": 1})
        assert r.status_code == 404 and f"`{REAL}`" not in r.json()["error"]["message"].split("serves")[1]
        r = http.post("/v1/completions", json={"model": SERVED, "prompt": "x", "max_tokens": 1})
        assert r.status_code == 200 and r.json()["model"] == SERVED


def test_echoed_values_are_cut(locked):
    auth = {"Authorization": f"Bearer {KEY}"}
    with locked.client(headers=auth) as http:
        r = http.post("/v1/completions", json={"model": "m" * 1_000_000, "prompt": "x"})
        assert r.status_code == 404 and len(r.content) < 1024, len(r.content)
        r = http.get("/" + "p" * 8000)
        assert r.status_code == 404 and len(r.content) < 1024, len(r.content)


def raw_exchange(live, request: bytes) -> bytes:
    url = urlparse(live.url)
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(request)
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    return data


@pytest.fixture(scope="module")
def open_server():
    live = start_server(FakeLLMEngine())
    yield live
    live.stop()


def test_content_length_with_transfer_encoding_is_refused_and_closed(open_server):
    body = b'{"model": "tiny", "prompt": "x", "max_tokens": 1}'
    chunked = b"%x\r\n%s\r\n0\r\n\r\n" % (len(body), body)
    head = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
            b"transfer-encoding: chunked\r\n")
    # raw_exchange returns once the server closes: the connection does not stay open after the 400.
    smuggled = raw_exchange(open_server, head + b"content-length: %d\r\n\r\n" % len(chunked) + chunked)
    assert smuggled.startswith(b"HTTP/1.1 400 ") and b"ambiguous_framing" in smuggled
    # Control: the same request with one framing is served.
    plain = raw_exchange(open_server, head + b"connection: close\r\n\r\n" + chunked)
    assert plain.startswith(b"HTTP/1.1 200 ")


def test_head_wherever_get_and_allow_on_405(open_server):
    with open_server.client() as http:
        for path in ("/health", "/ready", "/metrics", "/version", "/v1/models", f"/v1/models/{REAL}"):
            got, head = http.get(path), http.head(path)
            assert got.status_code == head.status_code == 200 and head.content == b"" and got.content, path
            assert head.headers["content-type"] == got.headers["content-type"]
        assert http.head("/admin/weights").status_code == 403  # as GET: a server without keys keeps admin shut
        r = http.get("/v1/completions")
        assert r.status_code == 405 and r.headers["allow"] == "POST"
        assert http.head("/v1/completions").status_code == 405, "HEAD where GET is not allowed either"


@pytest.mark.parametrize("body, key", [
    (b'{"model": "tiny", "prompt": "x", "temperature": 0, "temperature": 2}', "temperature"),
    (b'{"model": "tiny", "prompt": "x", "logit_bias": {"5": 1, "5": -100}}', "5"),
    (b'{"model": "tiny", "messages": [{"role": "user", "content": "a", "role": "system"}]}', "role"),
])
def test_duplicate_json_keys_are_refused_naming_the_key(open_server, body, key):
    path = "/v1/chat/completions" if b"messages" in body else "/v1/completions"
    with open_server.client() as http:
        r = http.post(path, content=body, headers={"content-type": "application/json"})
        assert r.status_code == 400 and r.json()["error"]["param"] == key, r.text
        assert r.json()["error"]["code"] == "duplicate_key" and repr(key) in r.json()["error"]["message"]
        # Control: each key once, the same request is served.
        once = body.replace(b', "temperature": 2', b"").replace(b', "5": -100', b"").replace(b', "role": "system"', b"")
        assert http.post(path, content=once, headers={"content-type": "application/json"}).status_code == 200


@pytest.mark.parametrize("key", ["+5", "1_0", "\u0665", " 5", "5 ", "05", "-1", "0x5", "5.0", "", "1" * 11])
def test_logit_bias_keys_must_be_plain_decimal_token_ids(open_server, key):
    with open_server.client() as http:
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1,
                                                "logit_bias": {key: 1.0}})
        assert r.status_code == 400 and r.json()["error"]["param"] == "logit_bias", (key, r.text)
        for plain in ("0", "5", "511"):  # control: canonical ids in the vocabulary are taken
            r = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "max_tokens": 1,
                                                    "logit_bias": {plain: 1.0}})
            assert r.status_code == 200, (plain, r.text)
        r = http.post("/v1/completions", json={"model": "tiny", "prompt": "x", "logit_bias": {"512": 1.0}})
        assert r.status_code == 400 and "outside the vocabulary [0, 512)" in r.json()["error"]["message"]


def test_a_header_block_past_h11s_limit_is_refused_in_json(open_server):
    """Headers over --max-header-bytes get the app's JSON 431; a block still incomplete past twice that is refused
    by the protocol before any app runs, and that 400 is OpenAI JSON with a request id too."""
    url = urlparse(open_server.url)
    limit = 2 * open_server.config.max_header_bytes
    with socket.create_connection((url.hostname, url.port), timeout=10) as sock:
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nx-big: " + b"a" * limit)  # no end of headers yet
        data = b""
        while chunk := sock.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 400 ") and b"content-type: application/json" in head.lower()
    assert b"x-request-id: " in head.lower() and json.loads(body)["error"]["code"] == "invalid_http"


def test_an_unexpected_error_on_any_route_is_openai_json_with_the_request_id(open_server, monkeypatch):
    """Not only the generation routes: an exception no route handles is a JSON 500 carrying X-Request-Id, through
    the middleware. Control: the same route answers 200 when nothing raises."""
    metrics = open_server.app.state.samebits.metrics

    def broken() -> bytes:
        raise RuntimeError("a bug")

    with open_server.client() as http:
        assert http.get("/metrics").status_code == 200
        monkeypatch.setattr(metrics, "render", broken)
        r = http.get("/metrics", headers={"x-request-id": "trace-7"})
    assert r.status_code == 500 and r.headers["content-type"] == "application/json"
    assert r.json()["error"]["code"] == "internal_error" and r.headers["x-request-id"] == "trace-7"


def test_integral_floats_for_integer_fields_are_refused_naming_the_field(open_server):
    # Refused, not coerced (docs/SECURITY.md): strict types, one rule for every integer field.
    with open_server.client() as http:
        for field, value in (("seed", 148885.0), ("prompt", [109.0, 2725.0]), ("max_tokens", 4.0)):
            body = {"model": "tiny", "prompt": "x", field: value}
            r = http.post("/v1/completions", json=body)
            assert r.status_code == 400 and r.json()["error"]["param"] == field, r.text


class SteppedEngine(FakeLLMEngine):
    """step() takes one permit; the test hands them out to place an abort between two steps."""

    def __init__(self):
        super().__init__()
        self.permits = threading.Semaphore(0)

    def step(self):
        assert self.permits.acquire(timeout=30), "no permit for the next step"
        return super().step()


def test_gauges_follow_an_abort_before_the_next_step_ends():
    engine = SteppedEngine()
    params = SamplingParams(max_tokens=200, ignore_eos=True)

    async def body():
        ae = AsyncEngine(engine)
        ae.start()
        a, b = ae.generate("a", [1, 2], params), ae.generate("b", [3, 4], params)
        firsts = asyncio.gather(a.__anext__(), b.__anext__())
        while not firsts.done():  # one step at a time until both have run (the adds may land in different steps)
            before = engine.steps
            engine.permits.release()
            while engine.steps == before:  # no permit is left over: the step after the last one waits
                await asyncio.sleep(0.005)
            await asyncio.wait({firsts}, timeout=0.2)
        await firsts
        steps, kv_before = engine.steps, ae.stats.kv_usage
        assert ae.stats.num_running == 2
        await a.aclose()  # the abort is queued while the next step waits for its permit
        engine.permits.release()  # that step runs; the abort is applied after it; the step after it waits
        deadline = time.monotonic() + 10
        while ae.stats.num_running != 1:
            assert time.monotonic() < deadline, "the gauge waited for a further step"
            await asyncio.sleep(0.01)
        assert engine.steps == steps + 1 and "a" not in engine.requests  # the gauge did not wait for one more step
        assert ae.stats.kv_usage < kv_before  # and a's blocks are already free
        await b.aclose()
        engine.permits.release(100)
        ae.shutdown()

    asyncio.run(body())
