"""Slow clients: a connection that stalls before its headers or its body is closed at its deadline, connections past
the cap are refused at once except for the probes. Raw sockets, so nothing buffers or retries for the client."""
from __future__ import annotations

import json
import os
import re
import socket
import time
from urllib.parse import urlparse

import pytest

from tests.server.conftest import MODEL_NAME, start_server
from tests.server.fake_engine import FakeLLMEngine

TIMEOUT_S = 0.5
MAX_CONNECTIONS = 4
GET_HEALTH = b"GET /health HTTP/1.1\r\nhost: x\r\n\r\n"


@pytest.fixture(scope="module")
def strict():
    live = start_server(FakeLLMEngine(), timeout_header=TIMEOUT_S, timeout_body=TIMEOUT_S,
                        max_connections=MAX_CONNECTIONS)
    yield live
    live.stop()


def connect(live) -> socket.socket:
    url = urlparse(live.url)
    sock = socket.create_connection((url.hostname, url.port), timeout=10)
    return sock


def closed_after(sock: socket.socket) -> tuple[float, bytes]:
    """Read until the server closes the connection: (seconds it took, every byte it sent)."""
    start, data = time.monotonic(), b""
    while chunk := sock.recv(65536):
        data += chunk
    return time.monotonic() - start, data


@pytest.mark.parametrize("sent", [b"", b"POST /v1/completions HTTP/1.1\r\nhost: x\r\n",
                                  (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
                                   b"content-length: 1000\r\n\r\n{")], ids=["nothing", "headers-only", "stalled-body"])
def test_a_stalled_connection_is_closed_at_its_deadline(strict, sent):
    with connect(strict) as sock:
        sock.sendall(sent)
        took, data = closed_after(sock)
    assert took < TIMEOUT_S + 2, took
    assert b" 200 " not in data
    assert strict.healthy()


def test_trickled_header_bytes_do_not_move_the_deadline(strict):
    with connect(strict) as sock:
        start = time.monotonic()
        head = b"GET /health HTTP/1.1\r\nx-slow: " + b"a" * 40
        for byte in head:
            try:
                sock.sendall(bytes([byte]))
            except OSError:  # closed under us: the deadline held
                break
            time.sleep(0.05)
        closed_after(sock)
    assert time.monotonic() - start < len(head) * 0.05 - 0.5, "the connection outlived the trickle"


def test_a_prompt_client_on_the_same_settings_is_served(strict):
    with connect(strict) as sock:
        sock.sendall(GET_HEALTH)
        time.sleep(TIMEOUT_S * 0.2)
        sock.sendall(GET_HEALTH)  # keep-alive: the second request gets a fresh header deadline
        sock.sendall(b"GET /health HTTP/1.1\r\nhost: x\r\nconnection: close\r\n\r\n")
        _, data = closed_after(sock)
    assert data.count(b"HTTP/1.1 200 OK") == 3


def _answer(live, request: bytes) -> tuple[float, bytes]:
    with connect(live) as sock:
        sock.sendall(request)
        return closed_after(sock)


def test_at_the_cap_probes_are_answered_and_everything_else_refused(strict):
    """At --max-connections (here held idle), /health and /metrics still answer on a probe slot, which closes after
    its answer, while a generation request is refused; once the probe slots are held too, a new connection gets the
    503 at once."""
    from samebits.server.connections import PROBE_SLOTS

    held = [connect(strict) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)  # the server has accepted them
        for request, status in ((GET_HEALTH, b"200"), (b"GET /metrics HTTP/1.1\r\nhost: x\r\n\r\n", b"200"),
                                (b"HEAD /ready HTTP/1.1\r\nhost: x\r\n\r\n", b"200"),
                                (b"GET /v1/models HTTP/1.1\r\nhost: x\r\n\r\n", b"503")):
            took, data = _answer(strict, request)
            assert data.startswith(b"HTTP/1.1 " + status) and took < 1, (request, data[:300])
            assert b"connection: close" in data.lower()
        assert b"too_many_connections" in data
        held += [connect(strict) for _ in range(PROBE_SLOTS)]
        time.sleep(0.1)
        took, data = _answer(strict, GET_HEALTH)
        assert data.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in data and took < 1
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.1)
    assert strict.healthy()


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def _metric(live, name: str) -> float:
    text = live.app.state.samebits.metrics.render().decode()
    return float(re.search(rf"^samebits:{name}\{{[^}}]*\}} (\S+)$", text, re.MULTILINE).group(1))


@pytest.mark.parametrize("timeout_write", [0.5, 60.0])
def test_a_stream_the_client_does_not_read_is_cut_at_its_write_deadline(timeout_write):
    """A client opens a stream of n=16 and reads nothing: the buffers fill (the kernel's kept small here, as a slow
    link's would be), writing pauses, and the write deadline later the connection is cut, the request aborted in the
    engine and counted; the server's RSS is back near where it started. Negative control: with a long deadline the
    same stream is still held."""
    engine = FakeLLMEngine(max_model_len=1 << 20)
    live = start_server(engine, timeout_write=timeout_write)
    # Accepted sockets take the listener's buffer size: 64 KiB of kernel buffer instead of autotuning's megabytes.
    live.thread.sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 64 * 1024)
    body = json.dumps({"model": MODEL_NAME, "prompt": "abc", "max_tokens": 20_000, "n": 16, "stream": True,
                       "ignore_eos": True}).encode()
    request = (b"POST /v1/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\n"
               b"content-length: %d\r\n\r\n" % len(body)) + body
    # The cut comes the deadline after the buffers fill: milliseconds alone, seconds on a loaded 2-core machine. The
    # control watches 2 s: far short of its deadline, long past the other's.
    ae, held_s = live.async_engine, 6.0 if timeout_write < 1 else 2.0
    try:
        start_rss = rss_bytes()
        url = urlparse(live.url)
        with socket.socket() as sock:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)  # before connecting: a small window
            sock.connect((url.hostname, url.port))
            sock.sendall(request)
            started = time.monotonic()
            wait_for(lambda: ae.counters.requests_aborted == 1 or time.monotonic() - started > held_s)
            if timeout_write < 1:
                assert ae.counters.requests_aborted == 1 and time.monotonic() - started < held_s
                assert not engine.requests and _metric(live, "write_timeouts_total") == 1
                wait_for(lambda: rss_bytes() - start_rss < 32 * 2**20)
            else:
                assert ae.counters.requests_aborted == 0 and engine.requests, "still streaming to nobody"
                assert _metric(live, "write_timeouts_total") == 0
        wait_for(lambda: not engine.requests)  # the client left: its request ends either way
        assert live.healthy()
    finally:
        live.stop()


def wait_for(predicate, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "condition never held"
        time.sleep(0.01)
