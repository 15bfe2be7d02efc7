"""`samebits serve` as a user runs it: a subprocess on loopback, the real engine on a tiny checkpoint."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx

from tests.subprocess_server import free_port, wait_healthy


def test_serve_command_end_to_end(tiny_model_dir):
    """The key comes from SAMEBITS_API_KEY: the server's argv never holds it."""
    port = free_port()
    cmd = [sys.executable, "-m", "samebits", "serve", "--model", str(tiny_model_dir), "--served-model-name", "tiny",
           "--port", str(port), "--device", "cpu", "--max-model-len", "128", "--log-level", "warning"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            env={**os.environ, "SAMEBITS_API_KEY": "sk-test"})
    try:
        url = f"http://127.0.0.1:{port}"
        wait_healthy(proc, url)
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert b"sk-test" not in f.read()
        r = httpx.post(f"{url}/v1/completions", headers={"Authorization": "Bearer sk-test"}, timeout=60,
                       json={"model": "tiny", "prompt": "hello", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.headers["x-samebits-mode"] == "deterministic"
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 401
    finally:
        proc.terminate()
        proc.wait(30)


def test_serve_logs_one_startup_line_after_loading(tiny_model_dir):
    port = free_port()
    cmd = [sys.executable, "-m", "samebits", "serve", str(tiny_model_dir), "--port", str(port), "--device", "cpu",
           "--max-model-len", "128", "--kv-cache-tokens", "1024", "--block-size", "16"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ})
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if "serving " in line or len(lines) > 50:
                break
        assert lines and "serving " in lines[-1], "".join(lines)
        line = lines[-1]
        for part in [f"on http://127.0.0.1:{port}", f"model {tiny_model_dir.name} (HF folder {tiny_model_dir})",
                     "mode deterministic", "dtype float32", "device cpu (engine in a thread)", "context 128 tokens",
                     "KV cache 64 blocks x 16 = 1024 tokens", "weights ", "fingerprint "]:
            assert part in line, (part, line)
        assert any("loading" in ln for ln in lines[:-1])
    finally:
        proc.terminate()
        proc.wait(30)


def test_a_busy_port_fails_before_the_model_loads(tmp_path):
    with socket.socket() as busy:
        busy.bind(("127.0.0.1", 0))
        busy.listen()
        port = busy.getsockname()[1]
        # No model at that path either: the port is checked first, so the error is about the port.
        res = subprocess.run([sys.executable, "-m", "samebits", "serve", str(tmp_path / "absent"), "--port",
                              str(port)], capture_output=True, text=True, timeout=120, check=False)
    assert res.returncode != 0
    lines = [ln for ln in (res.stdout + res.stderr).splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error: cannot listen on 127.0.0.1:"), lines
    assert "another --port" in lines[0]
