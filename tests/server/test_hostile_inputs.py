"""Huge and giant requests (issue 20, items 2, 3, 4, 6, 8): text too long to ever fit is refused before it is
tokenized while /health stays fast; the waiting limits count sequences and tokens; a request that could never fit is a
400, one that cannot fit now a 429 with Retry-After; chat's default max_tokens is capped; memory stays bounded."""
from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import threading
import time

import httpx
import pytest

from tests.server.conftest import MODEL_NAME, make_engine, start_server
from tests.server.fake_engine import FakeLLMEngine

HUGE = "word " * 800_000  # 4 MB, under the default 4 MiB body limit: the prompt
CMPL, CHAT = "/v1/completions", "/v1/chat/completions"


@pytest.fixture(scope="module")
def real(tiny_model_dir):
    live = start_server(make_engine(tiny_model_dir))
    yield live
    live.stop()


def test_text_that_cannot_fit_is_refused_before_tokenizing(real):
    limit = 32 * real.engine.max_model_len  # state.PROMPT_CHARS_PER_TOKEN per token of context
    with real.client() as http:
        # chat_template_kwargs count too: a template may render them into the prompt.
        kwargs = {"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": {"doc": ["x" * limit]}}
        for path, body in ((CMPL, {"prompt": ["ok", "x" * limit]}),
                           (CHAT, {"messages": [{"role": "user", "content": [{"type": "text", "text": "x" * limit},
                                                                            {"type": "text", "text": "y"}]}]}),
                           (CHAT, kwargs)):
            r = http.post(path, json={"model": MODEL_NAME, **body})
            assert r.status_code == 400 and r.json()["error"]["code"] == "prompt_too_long", r.text
            assert str(limit) in r.json()["error"]["message"] and "max_prompt_chars" in r.json()["error"]["message"]
        # At the limit it is tokenized and meets the context check instead.
        r = http.post(CMPL, json={"model": MODEL_NAME, "prompt": "x" * limit, "max_tokens": 1})
        assert r.status_code == 400 and r.json()["error"]["code"] != "prompt_too_long"


# Eight clients in another process (this one runs the server, and they would share its GIL), each sending HUGE.
SENDERS = """
import concurrent.futures, http.client, json, sys
host, port = sys.argv[1], int(sys.argv[2])
body = json.dumps({"model": "tiny", "prompt": "word " * 800_000, "max_tokens": 1}).encode()
def send(_):
    conn = http.client.HTTPConnection(host, port, timeout=60)
    conn.request("POST", "/v1/completions", body, {"content-type": "application/json"})
    return json.loads(conn.getresponse().read())["error"]["code"]
print(" ".join(concurrent.futures.ThreadPoolExecutor(8).map(send, range(8))))
"""


def test_health_stays_fast_while_eight_huge_prompts_are_refused(real):
    url = httpx.URL(real.url)
    senders = subprocess.Popen([sys.executable, "-c", SENDERS, url.host, str(url.port)], stdout=subprocess.PIPE,
                               text=True)
    probes = []
    with httpx.Client(base_url=real.url, timeout=60) as http:
        http.get("/health")  # a warm connection: the probe times the server, not a TCP handshake
        while senders.poll() is None or len(probes) < 5:
            start = time.perf_counter()
            assert http.get("/health").status_code == 200
            probes.append(time.perf_counter() - start)
    assert senders.stdout.read().split() == ["prompt_too_long"] * 8
    assert max(probes) < 0.1, sorted(probes)[-3:]


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def test_memory_after_rounds_of_refused_huge_prompts_stays_near_the_start(real):
    """The server runs in this process, so its RSS is ours; the clients run in another (their 4 MB strings are not
    the server's). Round one warms the allocator; three more may not grow it."""
    url = httpx.URL(real.url)

    def round_() -> None:
        sent = subprocess.run([sys.executable, "-c", SENDERS, url.host, str(url.port)], capture_output=True,
                              text=True, check=True)
        assert sent.stdout.split() == ["prompt_too_long"] * 8

    round_()
    start = rss_bytes()
    for _ in range(3):
        round_()
    grown = rss_bytes() - start
    assert grown < 64 * 2**20, f"RSS grew {grown / 2**20:.0f} MiB over three rounds"


@pytest.fixture
def gated():
    engine = FakeLLMEngine()
    engine.gate = threading.Event()
    live = start_server(engine, max_waiting=4, max_waiting_tokens=1000, max_n=16, default_max_tokens=5)
    yield live
    engine.gate.set()
    live.stop()


def error_of(r, status: int) -> dict:
    assert r.status_code == status, r.text
    return r.json()["error"]


def test_a_request_larger_than_the_waiting_limits_is_a_400(gated):
    with gated.client() as http:
        err = error_of(http.post(CMPL, json={"model": MODEL_NAME, "prompt": ["a", "b"], "n": 3}), 400)
        assert err["param"] == "n" and "6 sequences" in err["message"] and "max_waiting" in err["message"]
        err = error_of(http.post(CMPL, json={"model": MODEL_NAME, "prompt": "a", "n": 4, "max_tokens": 250}), 400)
        assert err["param"] == "max_tokens" and "max_waiting_tokens" in err["message"]
        assert gated.async_engine.counters.requests_added == 0  # refused whole: no prompt of it ran


def test_a_full_queue_is_a_429_with_retry_after_counting_sequences(gated):
    async def flood():
        async with httpx.AsyncClient(base_url=gated.url, timeout=30) as http:
            held = asyncio.ensure_future(http.post(CMPL, json={"model": MODEL_NAME, "prompt": "a", "n": 3,
                                                               "max_tokens": 2}))
            await asyncio.to_thread(wait_for, lambda: gated.async_engine.waiting_cost[0] == 3)
            small = await http.post(CMPL, json={"model": MODEL_NAME, "prompt": "a", "n": 2, "max_tokens": 2})
            fits = asyncio.ensure_future(http.post(CMPL, json={"model": MODEL_NAME, "prompt": "a", "max_tokens": 2}))
            await asyncio.to_thread(wait_for, lambda: gated.async_engine.waiting_cost[0] == 4)
            gated.engine.gate.set()
            return small, await held, await fits

    small, held, fits = asyncio.run(flood())
    # One request waits, but it holds three of the four sequences: two more do not fit, one does.
    assert error_of(small, 429)["code"] == "queue_full" and small.headers["retry-after"] == "1"
    assert held.status_code == 200 and fits.status_code == 200


def wait_for(predicate, timeout_s: float = 20) -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)


def test_chat_without_max_tokens_stops_at_the_server_cap(gated):
    gated.engine.gate.set()
    with gated.client() as http:
        r = http.post(CHAT, json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                                  "ignore_eos": True})
        assert r.status_code == 200 and r.json()["usage"]["completion_tokens"] == 5, r.text
        r = http.post(CHAT, json={"model": MODEL_NAME, "messages": [{"role": "user", "content": "hi"}],
                                  "ignore_eos": True, "max_tokens": 7})
        assert r.json()["usage"]["completion_tokens"] == 7  # an explicit value is the client's
