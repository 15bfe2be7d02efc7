"""A word-level fake OpenAI endpoint (completions and chat) on a real socket, for the check's tests.

Its "model" is a hash: the next word and its logprob are functions of the context, and of the seed when sampling,
so the endpoint is exactly deterministic unless a flaw is switched on:
- `inflight_shift`: every logprob moves by this much per extra request in flight during the request (a server
  whose numerics follow the batch); each request spends `step_s` "computing" so that a burst overlaps;
- `echo_shift`: prompt tokens scored through `echo` get logprobs shifted by this (prefill differs from decode).
"""
from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from samebits.check.prompts import WORDS

MODEL = "fake-model"


@dataclass
class Flaws:
    inflight_shift: float = 0.0
    echo_shift: float = 0.0
    step_s: float = 0.0
    logprobs: bool = True
    echo: bool = True
    api_key: str | None = None
    busy_first: int = 0  # answer this many requests with 429 first


def _h(*parts) -> int:
    return int.from_bytes(hashlib.sha256(repr(parts).encode()).digest()[:8], "big")


def tokenize(text: str) -> list[str]:
    words = text.split(" ")
    return [words[0]] + [" " + w for w in words[1:]]


def logprob(context: tuple[str, ...], token: str) -> float:
    return -((_h("lp", context, token) % 10**6) / 10**5) - 0.01


def next_token(context: tuple[str, ...], temperature: float, seed: int | None) -> str:
    salt = ("sample", seed, len(context)) if temperature else ("greedy",)
    return " " + WORDS[_h(context, *salt) % len(WORDS)]


class State:
    def __init__(self, flaws: Flaws):
        self.flaws = flaws
        self.lock = threading.Lock()
        self.active: list[dict] = []
        self.requests = 0

    def enter(self) -> dict:
        me = {"peak": 0}
        with self.lock:
            self.requests += 1
            self.active.append(me)
            for r in self.active:
                r["peak"] = max(r["peak"], len(self.active))
        return me

    def leave(self, me: dict) -> None:
        with self.lock:  # by identity: list.remove compares dicts by value and could take another request's entry
            self.active = [r for r in self.active if r is not me]


def generate(state: State, me: dict, prompt: str, body: dict) -> tuple[list[str], list[float]]:
    f = state.flaws
    if f.step_s:
        threading.Event().wait(f.step_s)  # the simulated forward pass, during which a burst piles up
    shift = f.inflight_shift * (me["peak"] - 1)
    context, tokens, lps = tuple(tokenize(prompt)), [], []
    for _ in range(int(body.get("max_tokens") or 16)):
        tok = next_token(context, float(body.get("temperature") or 0), body.get("seed"))
        tokens.append(tok)
        lps.append(logprob(context, tok) + shift)
        context += (tok,)
    return tokens, lps


def completion(state: State, me: dict, body: dict) -> tuple[int, dict]:
    f, prompt = state.flaws, body["prompt"]
    if body.get("echo") and not f.echo:
        return 400, {"error": {"message": "echo is not supported", "type": "invalid_request_error"}}
    tokens, lps = generate(state, me, prompt, body)
    text = "".join(tokens)
    lp = {"tokens": tokens, "token_logprobs": lps, "top_logprobs": [{t: v} for t, v in zip(tokens, lps)]}
    if body.get("echo"):
        ptoks = tokenize(prompt)
        plps = [None] + [logprob(tuple(ptoks[:i]), ptoks[i]) + f.echo_shift for i in range(1, len(ptoks))]
        lp = {"tokens": ptoks + tokens, "token_logprobs": plps + lps, "top_logprobs": None}
        text = prompt + text
    choice = {"index": 0, "text": text, "logprobs": lp if f.logprobs and body.get("logprobs") is not None else None,
              "finish_reason": "length"}
    return 200, {"object": "text_completion", "model": MODEL, "system_fingerprint": "fp_fake", "choices": [choice]}


def chat(state: State, me: dict, body: dict) -> tuple[int, dict]:
    tokens, lps = generate(state, me, body["messages"][-1]["content"], body)
    lp = {"content": [{"token": t, "logprob": v, "top_logprobs": []} for t, v in zip(tokens, lps)]}
    choice = {"index": 0, "message": {"role": "assistant", "content": "".join(tokens)},
              "logprobs": lp if state.flaws.logprobs and body.get("logprobs") else None, "finish_reason": "length"}
    return 200, {"object": "chat.completion", "model": MODEL, "system_fingerprint": "fp_fake", "choices": [choice]}


def _error(status: int, message: str) -> tuple[int, dict]:
    return status, {"error": {"message": message, "type": "invalid_request_error"}}


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    state: State

    def log_message(self, *args) -> None:  # keep pytest output clean
        pass

    def _reply(self, status: int, body: dict, headers: dict | None = None) -> None:
        data = json.dumps(body).encode()
        self.send_response(status)
        for k, v in {"Content-Type": "application/json", "Content-Length": str(len(data)), **(headers or {})}.items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _authorised(self) -> bool:
        key = self.state.flaws.api_key
        return key is None or self.headers.get("Authorization") == f"Bearer {key}"

    def do_GET(self) -> None:
        if not self._authorised():
            return self._reply(*_error(401, "Incorrect API key provided."))
        if self.path == "/v1/models":
            return self._reply(200, {"object": "list", "data": [{"id": MODEL, "object": "model"}]})
        return self._reply(*_error(404, f"no route {self.path}"))

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
        if not self._authorised():
            return self._reply(*_error(401, "Incorrect API key provided."))
        routes = {"/v1/completions": completion, "/v1/chat/completions": chat}
        if self.path not in routes:
            return self._reply(*_error(404, f"no route {self.path}"))
        if body.get("model") != MODEL:
            return self._reply(*_error(404, f"The model `{body.get('model')}` does not exist."))
        with self.state.lock:
            busy = self.state.requests < self.state.flaws.busy_first
            self.state.requests += busy
        if busy:
            return self._reply(*_error(429, "busy"), {"Retry-After": "0"})
        me = self.state.enter()
        try:
            self._reply(*routes[self.path](self.state, me, body), {"X-Fake-Fingerprint": "fake-numerics-1"})
        finally:
            self.state.leave(me)


class FakeServer:
    """`with FakeServer(Flaws(...)) as url:` serves on a free loopback port until the block ends."""

    def __init__(self, flaws: Flaws | None = None):
        handler = type("BoundHandler", (Handler,), {"state": State(flaws or Flaws())})
        self.state = handler.state
        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.httpd.daemon_threads = True
        self.thread = threading.Thread(target=self.httpd.serve_forever, daemon=True)

    def __enter__(self) -> str:
        self.thread.start()
        return f"http://127.0.0.1:{self.httpd.server_address[1]}"

    def __exit__(self, *exc) -> None:
        self.httpd.shutdown()
        self.httpd.server_close()
        self.thread.join(10)
