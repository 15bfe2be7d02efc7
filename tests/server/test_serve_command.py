"""`samebits serve` as a user runs it: a subprocess on loopback, the real engine on a tiny checkpoint."""
from __future__ import annotations

import os
import socket
import subprocess
import sys

import httpx

from tests.subprocess_server import free_port, wait_healthy


def test_serve_command_end_to_end_with_vllms_flags(tiny_model_dir, tmp_path):
    """The serve flags of 2026-12-04 that were "No such option": several served names (the first reported),
    a chat template file, --trust-remote-code (accepted, said unneeded), --disable-log-requests (no access lines),
    --gpu-memory-utilization (on the CPU, accepted). The key comes from SAMEBITS_API_KEY: the server's argv never
    holds it."""
    from samebits.models.tokenizer import Tokenizer

    template = tmp_path / "t.jinja"
    template.write_text("{% for m in messages %}[{{ m['role'] }}] {{ m['content'] }}\n{% endfor %}")
    port = free_port()
    cmd = [sys.executable, "-m", "samebits", "serve", str(tiny_model_dir), "--served-model-name", "tiny", "other",
           "--port", str(port), "--device", "cpu", "--max-model-len", "128",
           "--log-level", "info", "--chat-template", str(template), "--trust-remote-code", "--disable-log-requests",
           "--gpu-memory-utilization", "0.9"]
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, "SAMEBITS_API_KEY": "sk-test"})
    try:
        url, auth = f"http://127.0.0.1:{port}", {"Authorization": "Bearer sk-test"}
        wait_healthy(proc, url)
        with open(f"/proc/{proc.pid}/cmdline", "rb") as f:
            assert b"sk-test" not in f.read()
        r = httpx.post(f"{url}/v1/completions", headers=auth, timeout=60,
                       json={"model": "other", "prompt": "hello", "max_tokens": 3, "temperature": 0})
        assert r.status_code == 200 and r.headers["x-samebits-mode"] == "deterministic"
        assert r.json()["model"] == "tiny"
        assert httpx.get(f"{url}/v1/models", timeout=5).status_code == 401
        models = httpx.get(f"{url}/v1/models", headers=auth, timeout=5).json()["data"]
        assert [m["id"] for m in models] == ["tiny", "other"]
        chat = [{"role": "user", "content": "hi"}]
        ids = httpx.post(f"{url}/tokenize", headers=auth, json={"messages": chat}, timeout=10).json()["tokens"]
        assert ids == Tokenizer.from_hf_dir(tiny_model_dir).encode("[user] hi\n", add_special_tokens=False)
    finally:
        proc.terminate()
        out = proc.communicate(timeout=30)[0]
    assert "--trust-remote-code is not needed" in out
    assert "POST /v1/completions" not in out, out


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
