"""Every ASGI message the app sends, byte for byte, against a record made before the streaming path was rewritten.

A scripted engine makes each request's outputs a function of the request alone and hands them over one step at a
time, in order, so the messages (status, headers, every SSE body and its boundaries) are too: the app is called as
uvicorn calls it and every message it sends is compared with tests/server/sse_golden.json. uvicorn's framing is a
function of those messages, so equal messages are equal bytes on the wire. The record was written by the code of
commit a525f36 (the per-chunk dict and generator path); rewrite it only for a change meant to change what clients
receive:

    python -m tests.server.test_sse_bytes      # from the repository root: writes tests/server/sse_golden.json
"""
from __future__ import annotations

import asyncio
import hashlib
import json
import struct
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest

from samebits.engine.async_engine import AsyncEngine, EngineDead
from samebits.engine.outputs import CompletionOutput, EngineInfo, EngineStats, PromptLogprobs, RequestOutput
from samebits.errors import FieldError

GOLDEN = Path(__file__).with_name("sse_golden.json")
VOCAB = 64
FAIL_MID_STREAM = 13  # max_tokens that makes the scripted engine fail after a few outputs (an error event)
FAIL_AT_ADD = 14  # max_tokens that the engine refuses before any output (a 400)


def _h(*parts) -> int:
    return int.from_bytes(hashlib.blake2b(repr(parts).encode(), digest_size=8).digest(), "little")


def _f32(x: float) -> float:
    return struct.unpack("<f", struct.pack("<f", x))[0]


class GoldenTokenizer:
    """Token t is one CJK character, except: t % 13 == 4 is text JSON must escape, t % 13 == 9 a non-BMP character,
    and t % 7 == 3 the first half of a split character (U+FFFD while it is the last token)."""

    vocab_size = VOCAB
    eos_token_ids = frozenset({0})

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        return [ord(ch) % (VOCAB - 1) + 1 for ch in text]

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        out, i = [], 0
        while i < len(ids):
            t = ids[i]
            if t % 7 == 3:
                out.append(chr(0x4E00 + t) if i + 1 < len(ids) else "\ufffd")
                i += 2
                continue
            out.append('"q\\\n\t\x01' if t % 13 == 4 else "\U0001F642" if t % 13 == 9 else chr(0x4E00 + t))
            i += 1
        return "".join(out)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True) -> str:
        return "".join(f"{m['role']}:{m['content']}\n" for m in messages) + ("assistant:" if add_generation_prompt else "")


class GoldenEngine:
    """What ServerState reads of an LLMEngine; the outputs come from `script`."""

    def __init__(self):
        self.tokenizer = GoldenTokenizer()
        self.max_model_len, self.vocab_size, self.model_name = 256, VOCAB, "golden"
        self._drawn = 0

    def fingerprint(self) -> dict:
        return {"samebits": "0.0.0", "torch": None, "cuda_runtime": None, "cublas": None, "driver": None,
                "mode": "deterministic", "numerics_profile": "golden", "hash": "golden0",
                "tensor_parallel": {"size": 1, "all_reduce": None, "invariant": False}}

    def draw_seed(self) -> int:
        self._drawn += 1
        return _h("drawn", self._drawn) % 2**63

    def validate(self, prompt_token_ids, params, where="prompt") -> None:
        pass

    def info(self) -> EngineInfo:
        return EngineInfo(self.model_name, "golden", "deterministic", VOCAB, self.max_model_len, "float32", "cpu", 0, 16)

    def stats(self) -> EngineStats:
        return EngineStats(0, 0, 0.0, 0, 0, 0, 0, 0)


def _sample_steps(tok, ids: list[int], params, j: int) -> list[CompletionOutput]:
    """Sample j's cumulative output after each step: none (the prefill), then one token more a step, until a stop
    string or max_tokens ends it; a finished sample stays as it ended."""
    drawn = [_h(ids, params.seed, j, pos) % VOCAB for pos in range(params.max_tokens)]
    steps, finish, stop_reason, text = [CompletionOutput(j, "", [], None, None)], None, None, ""
    for k in range(1, params.max_tokens + 1):
        if finish is None:
            text = tok.decode(drawn[:k])
            hits = [(text.find(s), s) for s in params.stop_strings if s in text]
            if hits:
                at, stop = min(hits)
                text, finish, stop_reason = text[:at], "stop", stop
            elif k == params.max_tokens:
                finish = "length"
            n = k
        lps = [_f32(-(_h("lp", t, i) % 100000) / 7919.0) for i, t in enumerate(drawn[:n])]
        lps[0:1] = [float("-inf")] if j == 1 and lps else lps[0:1]  # one -inf: JSON sends it as -9999.0
        want = params.logprobs is not None
        tops = [{(t + r) % VOCAB: _f32(-r - 0.5) for r in range(params.logprobs)} for t in drawn[:n]] if want else None
        steps.append(CompletionOutput(j, text, drawn[:n], lps if want else None, tops, _f32(sum(lps)), finish,
                                      stop_reason))
    return steps


def _prompt_logprobs(ids: list[int], k: int) -> PromptLogprobs:
    rows = range(1, len(ids))
    return PromptLogprobs(ids, [_f32(-(_h("plp", ids[i], i) % 1000) / 97.0) for i in rows],
                          [1 + _h("rank", i) % 5 for i in rows],
                          [{(ids[i] + r) % VOCAB: _f32(-r - 0.25) for r in range(k)} for i in rows])


def script(tok, request_id: str, ids: list[int], params, prompt) -> list[RequestOutput]:
    samples = [_sample_steps(tok, ids, params, j) for j in range(params.n)]
    plp = None if params.prompt_logprobs is None else _prompt_logprobs(ids, params.prompt_logprobs)
    outs = []
    for k in range(params.max_tokens + 1):
        outputs = [s[k] for s in samples]
        done = all(c.finish_reason is not None for c in outputs)
        outs.append(RequestOutput(request_id, prompt, list(ids), outputs, 3, params.seed, "golden0", done, plp))
        if done:
            break
    return outs


class ScriptedAsyncEngine(AsyncEngine):
    """AsyncEngine with no thread: generate() hands out the script's outputs in order, each after a pass of the
    event loop, as the engine thread's would arrive."""

    async def generate(self, request_id, prompt_token_ids, params, prompt=None, *, final_only=False):
        if params.max_tokens == FAIL_AT_ADD:
            raise FieldError("max_tokens", "max_tokens: the scripted engine refuses 14")
        for k, out in enumerate(script(self.engine.tokenizer, request_id, prompt_token_ids, params, prompt)):
            await asyncio.sleep(0)
            if params.max_tokens == FAIL_MID_STREAM and k == 3:
                raise EngineDead("the engine loop has stopped: scripted")
            if out.finished or not final_only:
                yield out


# ---- the requests ---------------------------------------------------------------------------------------------------
def _cases() -> list[tuple[str, dict]]:
    text, chat = "/v1/completions", "/v1/chat/completions"
    msgs = [{"role": "user", "content": "hé \"x\""}]
    base = {"model": "golden", "temperature": 0.7}
    cases = [
        (text, {"prompt": "一二三", "max_tokens": 6, "seed": 1, "stream": True}),
        (text, {"prompt": [5, 6, 7], "max_tokens": 9, "seed": 2, "stream": True, "logprobs": 0,
                "stream_options": {"include_usage": True}}),
        (text, {"prompt": "abc", "max_tokens": 7, "seed": 3, "n": 2, "stream": True, "logprobs": 2}),
        (text, {"prompt": [[1, 2], [3, 4, 5]], "max_tokens": 5, "seed": 4, "n": 2, "stream": True,
                "stream_options": {"include_usage": True}}),
        (text, {"prompt": "回声", "max_tokens": 4, "seed": 5, "stream": True, "echo": True}),
        (text, {"prompt": "回声", "max_tokens": 4, "seed": 6, "stream": True, "echo": True, "logprobs": 1}),
        (text, {"prompt": [[9, 8], [7, 6]], "max_tokens": 0, "seed": 7, "stream": True, "echo": True,
                "logprobs": 0}),
        (text, {"prompt": "停", "max_tokens": 30, "seed": 8, "stream": True, "stop": ["X"]}),
        (text, {"prompt": "无种子", "max_tokens": 5, "stream": True}),
        (text, {"prompt": "长", "max_tokens": 40, "seed": 9, "stream": True, "logprobs": 0}),
        (text, {"prompt": "x", "max_tokens": FAIL_MID_STREAM, "seed": 10, "stream": True, "logprobs": 0}),
        (text, {"prompt": [[1], [2]], "max_tokens": FAIL_MID_STREAM, "seed": 10, "stream": True}),
        (text, {"prompt": "x", "max_tokens": FAIL_AT_ADD, "seed": 11, "stream": True}),
        (text, {"prompt": "x", "max_tokens": 4, "seed": 12, "stream": True, "prompt_logprobs": 1}),
        (text, {"prompt": "整", "max_tokens": 6, "seed": 13, "logprobs": 2, "n": 2}),
        (text, {"prompt": "整", "max_tokens": 3, "seed": 13, "echo": True, "logprobs": 1, "prompt_logprobs": 2}),
        (chat, {"messages": msgs, "max_tokens": 6, "seed": 20, "stream": True}),
        (chat, {"messages": msgs, "max_tokens": 5, "seed": 21, "n": 2, "stream": True, "logprobs": True,
                "top_logprobs": 2, "stream_options": {"include_usage": True}}),
        (chat, {"messages": msgs, "max_tokens": 5, "seed": 22, "stream": True, "logprobs": True}),
        (chat, {"messages": msgs, "max_tokens": 30, "seed": 23, "stream": True, "stop": ["X", "YZ"]}),
        (chat, {"messages": msgs, "max_tokens": FAIL_MID_STREAM, "seed": 24, "stream": True}),
        (chat, {"messages": msgs, "max_tokens": 4, "seed": 25, "logprobs": True, "top_logprobs": 1}),
    ]
    return [(path, {**base, **body}) for path, body in cases]


def _with_stops(tok, path: str, body: dict) -> dict:
    """Stop strings the stream will meet: the text's 3rd-4th characters (cut there, the 3rd held back a step
    first), and its 6th followed by one it never has (held back, then sent)."""
    if body.get("stop") is None:
        return body
    from samebits.engine.sampling_params import SamplingParams

    ids = tok.encode(body["prompt"] if path.endswith("/completions") and "prompt" in body else
                     tok.apply_chat_template(body["messages"]))
    params = SamplingParams(temperature=0.7, max_tokens=body["max_tokens"], seed=body["seed"])
    text = _sample_steps(tok, ids, params, 0)[-1].text
    return {**body, "stop": [text[2:4], text[5] + "\u2603"]}


# ---- calling the app as uvicorn does ---------------------------------------------------------------------------------
def _scope(path: str, body: bytes, rid: str) -> dict:
    headers = [(b"host", b"golden"), (b"content-type", b"application/json"),
               (b"content-length", str(len(body)).encode()), (b"x-request-id", rid.encode())]
    return {"type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "headers": headers, "client": ("127.0.0.1", 5000), "server": ("127.0.0.1", 8000),
            "state": {}}


def _message(m: dict) -> dict:
    """An ASGI message as JSON: bytes as text (UTF-8 bodies, latin-1 headers), every key kept."""
    out = {}
    for k, v in m.items():
        if k == "headers":
            v = [[a.decode("latin-1"), b.decode("latin-1")] for a, b in v]
        elif isinstance(v, bytes):
            v = v.decode("utf-8")
        out[k] = v
    return out


async def _call(app, path: str, body: dict, rid: str) -> list[dict]:
    raw = json.dumps(body).encode()
    sent, complete, given = [], asyncio.Event(), []

    async def receive():
        if not given:
            given.append(1)
            return {"type": "http.request", "body": raw, "more_body": False}
        await complete.wait()  # as uvicorn's: once the body is read, it returns only when the connection closes
        return {"type": "http.disconnect"}

    async def send(message):
        sent.append(_message(message))
        if message["type"] == "http.response.body" and not message.get("more_body", False):
            complete.set()

    await app(_scope(path, raw, rid), receive, send)
    return sent


def record(monkeypatch_ids) -> dict[str, list[dict]]:
    """Every case's messages, on one fresh app (so drawn seeds are the same each run)."""
    from samebits.server.app import build_app
    from samebits.server.config import ServerConfig

    monkeypatch_ids()
    config = ServerConfig.from_dict({"model": "golden", "port": 0, "log_level": "warning", "max_n": 4})
    engine = GoldenEngine()
    app = build_app(ScriptedAsyncEngine(engine, max_waiting=config.engine.max_waiting), config)

    async def run_all():
        out = {}
        for i, (path, body) in enumerate(_cases()):
            body = _with_stops(engine.tokenizer, path, body)
            out[f"{i:02d} {path} {json.dumps(body, ensure_ascii=False)}"] = await _call(app, path, body, f"rid-{i}")
        return out

    return asyncio.run(run_all())


def _fixed_ids(setattr_):
    """Request ids and `created` from counters, not uuid4 and the clock."""
    import samebits.server.requests as requests_module

    counter = iter(range(10**6))
    setattr_(requests_module, "uuid", SimpleNamespace(uuid4=lambda: SimpleNamespace(hex=f"{next(counter):032x}")))
    setattr_(requests_module, "time", SimpleNamespace(time=lambda: 1700000000.5))


def differences(got: dict, want: dict) -> list[str]:
    """Where two records differ: a case missing, or its first differing message."""
    out = [f"{case}: missing" for case in want if case not in got] + [f"{c}: unexpected" for c in got if c not in want]
    for case in want.keys() & got.keys():
        a, b = got[case], want[case]
        for i, (m, w) in enumerate(zip(a, b)):
            if m != w:
                out.append(f"{case}: message {i}: {m!r} != {w!r}")
                break
        else:
            if len(a) != len(b):
                out.append(f"{case}: {len(a)} messages, the record has {len(b)}")
    return out


@pytest.fixture(scope="module")
def recorded():
    mp = pytest.MonkeyPatch()
    try:
        yield record(lambda: _fixed_ids(mp.setattr))
    finally:
        mp.undo()


def test_every_message_equals_the_record(recorded):
    want = json.loads(GOLDEN.read_text(encoding="utf-8"))
    assert differences(recorded, want) == []
    bodies = [m for ms in want.values() for m in ms if m["type"] == "http.response.body"]
    events = sum(m["body"].count("data: ") for m in bodies)
    # It covers what it claims: every kind of event, split characters held back, an error event, a 400, stops.
    assert len(want) == len(_cases()) and len(bodies) > 150 and events > 150
    joined = "".join(m["body"] for m in bodies)
    # logprobs=0's alternatives: the sampled token alone (responses.completion_logprobs_json's fast route).
    for piece in ('"top_logprobs":[{"不":-7.351686000823975}]', '"text_offset":[', '"delta":{"role":"assistant"', '"usage":{',
                  '"error":{', "data: [DONE]", '"finish_reason":"stop"', "-9999.0", "\ufffd", "\\u0001",
                  '"prompt_logprobs":[null', "\U0001F642"):
        assert piece in joined, piece
    statuses = {m["status"] for ms in want.values() for m in ms if m["type"] == "http.response.start"}
    assert statuses == {200, 400}


def test_negative_control_one_changed_byte_shows(recorded):
    """The comparison is not vacuous: one byte changed in one SSE body (or one body message split in two, the same
    bytes in other chunks) is reported."""
    case = next(c for c, ms in recorded.items() if "stream" in c and len(ms) > 8)
    flipped = json.loads(json.dumps(recorded))
    m = flipped[case][4]
    m["body"] = m["body"][:10] + chr(ord(m["body"][10]) ^ 1) + m["body"][11:]
    assert differences(flipped, recorded) and differences(flipped, recorded)[0].startswith(case)
    split = json.loads(json.dumps(recorded))
    body = split[case][4]["body"]
    split[case][4:5] = [{**split[case][4], "body": body[:5]}, {**split[case][4], "body": body[5:]}]
    assert differences(split, recorded)


def _write() -> None:
    from pytest import MonkeyPatch

    mp = MonkeyPatch()
    try:
        rec = record(lambda: _fixed_ids(mp.setattr))
    finally:
        mp.undo()
    GOLDEN.write_text(json.dumps(rec, ensure_ascii=False, indent=0) + "\n", encoding="utf-8")
    print(f"wrote {GOLDEN}: {len(rec)} cases, {sum(map(len, rec.values()))} messages")


if __name__ == "__main__":
    sys.exit(_write())
