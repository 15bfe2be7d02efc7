"""A `samebits serve` subprocess in a test: a free loopback port for it, and waiting until it answers."""
from __future__ import annotations

import socket
import subprocess
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_healthy(proc: subprocess.Popen, url: str, limit_s: float = 90.0) -> None:
    """Poll /health until it answers 200; between polls wait on the process itself, so a crash ends the wait (with
    its output, when the test captured it)."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                return
        except httpx.TransportError:
            pass
        try:
            proc.wait(timeout=0.2)
        except subprocess.TimeoutExpired:
            continue
        output = proc.stdout.read() if proc.stdout is not None else ""
        output = output.decode(errors="replace") if isinstance(output, bytes) else output
        raise AssertionError(f"server exited with {proc.returncode}: {output[-2000:]}")
    raise AssertionError(f"server not healthy within {limit_s}s")
