"""`samebits serve` as a user runs it: a subprocess on loopback, the real engine on a tiny checkpoint."""
from __future__ import annotations

import os
import socket
import subprocess
import sys
import time

import httpx


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_serve_command_end_to_end(tiny_model_dir):
    port = free_port()
    cmd = [sys.executable, "-m", "samebits", "serve", "--model", str(tiny_model_dir), "--served-model-name", "tiny",
           "--port", str(port), "--device", "cpu", "--max-model-len", "128", "--api-key", "sk-test",
           "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, env={**os.environ})
    try:
        url, deadline = f"http://127.0.0.1:{port}", time.monotonic() + 90
        while True:
            assert proc.poll() is None, proc.stdout.read().decode()
            try:
                if httpx.get(f"{url}/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, "server did not come up"
            time.sleep(0.2)
        r = httpx.post(f"{url}/v1/completions", headers={"Authorization": "Bearer sk-test"}, timeout=60,
                       json={"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.headers["x-samebits-mode"] == "deterministic"
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 401
    finally:
        proc.terminate()
        proc.wait(30)
