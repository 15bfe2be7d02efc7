"""Slow clients (issue 20, item 1): a connection that stalls before its headers or its body is closed at its deadline,
and connections past the cap are refused at once. Raw sockets, so nothing buffers or retries for the client."""
from __future__ import annotations

import socket
import time
from urllib.parse import urlparse

import pytest

from tests.server.conftest import start_server
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


def test_connections_past_the_cap_are_refused_at_once(strict):
    held = [connect(strict) for _ in range(MAX_CONNECTIONS)]
    try:
        time.sleep(0.1)  # the server has accepted them
        with connect(strict) as extra:
            extra.sendall(GET_HEALTH)
            took, data = closed_after(extra)
        assert data.startswith(b"HTTP/1.1 503 ") and b"too_many_connections" in data and took < 1
    finally:
        for sock in held:
            sock.close()
    time.sleep(0.1)
    assert strict.healthy()
