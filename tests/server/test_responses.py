"""Incremental text: what a stream may send before a request finishes."""
from __future__ import annotations

from types import SimpleNamespace

from samebits.server.responses import CHUNK_END, ChoiceCursor, dumps, lp, safe_text


def test_safe_text_holds_back_partial_characters_and_stop_prefixes():
    assert safe_text("abc\ufffd", [], finished=False) == "abc"
    assert safe_text("abc\ufffd", [], finished=True) == "abc\ufffd"
    assert safe_text("hello wo", ["world"], finished=False) == "hello "
    assert safe_text("hello w", ["xy", "wz"], finished=False) == "hello "
    assert safe_text("hello", ["world"], finished=False) == "hello"


def test_cursor_deltas_concatenate_to_the_final_text():
    states = [("ab", [1]), ("ab\ufffd", [1, 2]), ("ab你", [1, 2, 3]), ("ab你 ST", [1, 2, 3, 4]),
              ("ab你 STx", [1, 2, 3, 4, 5])]
    cursor, text, ids = ChoiceCursor(), "", []
    for i, (t, toks) in enumerate(states):
        done = i == len(states) - 1
        step = cursor.advance(SimpleNamespace(text=t, token_ids=toks, finish_reason="length" if done else None),
                              ["STOP"])
        if step:
            ids += step[0]
            text += step[2]
    assert text == "ab你 STx" and ids == [1, 2, 3, 4, 5]


def test_float32_logprobs_survive_json():
    import json
    import struct

    for bits in (0xBF800001, 0xC0490FDB, 0xB3800000, 0xC2C7FFFF):
        value = struct.unpack("<f", struct.pack("<I", bits))[0]
        back = json.loads(dumps({"v": lp(value)}))["v"]
        assert struct.pack("<f", back) == struct.pack("<I", bits)
    assert lp(float("-inf")) == -9999.0


# ---- chunks: written out, equal to the JSON encoder on the dicts they replaced -------------------------------------
SEED = 0
# Quotes, escapes, control characters, non-BMP, a replacement character, and two ids with one text (a top-logprobs
# dict then keeps the first's place and the last's value, as the dict-building path does).
TOKEN_TEXTS = ['a', ' "q"', "\\", "\n\t\x01", "你好", "🙂", "\ufffd", "é", "a", "</s>"]


def _writer(kind: str, logprobs: bool, echo_only: bool = False, n: int = 2):
    from json.encoder import encode_basestring

    from samebits.server.requests import Job, Meta
    from samebits.server.responses import StreamWriter

    state = SimpleNamespace(token_text=TOKEN_TEXTS.__getitem__,
                            token_json=lambda t: (encode_basestring(TOKEN_TEXTS[t]), len(TOKEN_TEXTS[t])))
    meta = Meta("cmpl-ü\"x", 1700000000, "tiny/\u00e9", "fp\\1", 2**63 - 1)
    job = Job(kind, meta, [], SimpleNamespace(n=n), [], False, logprobs, False, echo_only=echo_only)
    return StreamWriter(state, job)


def _reference(w, index: int, c, ids: list[int], start: int, text: str, offset: int) -> bytes:
    """The event as it was built before: the choice's dict in the chunk's dict, through json.dumps itself."""
    import json

    from samebits.server.responses import _chat_logprobs, _text_logprobs

    finish = c.finish_reason if c.finish_reason is not None and start + len(ids) == len(c.token_ids) else None
    if w.job.echo_only:
        ids, text = [], ""
    if w.job.kind == "chat":
        lps = _chat_logprobs(w.state, c, ids, start) if w.job.logprobs else None
        choice = {"index": index, "delta": {"content": text}, "logprobs": lps, "finish_reason": finish,
                  "token_ids": ids}
    else:
        lps = _text_logprobs(w.state, c, ids, start, offset) if w.job.logprobs else None
        choice = {"index": index, "text": text, "logprobs": lps, "finish_reason": finish, "token_ids": ids}
    chunk = {**w._head(), "choices": [choice]}
    return f"data: {json.dumps(chunk, ensure_ascii=False, separators=(',', ':'), allow_nan=False)}\n\n".encode()


def _random_output(rng, length: int, top_k: int | None, finish):
    from samebits.engine.outputs import CompletionOutput

    ids = [rng.randrange(len(TOKEN_TEXTS)) for _ in range(length)]
    lps = [rng.choice([float("-inf"), -0.0, -1e-30, -3.4028234663852886e38, -rng.random() * 20]) for _ in ids]
    tops = None if top_k is None else [{rng.randrange(len(TOKEN_TEXTS)): -rng.random() * 5 for _ in range(top_k)}
                                       for _ in ids]
    return CompletionOutput(1, "".join(TOKEN_TEXTS[t] for t in ids), ids, None if top_k is None else lps, tops,
                            None, finish)


def test_chunks_equal_the_json_encoder_on_the_same_dicts():
    import random

    rng = random.Random(SEED)
    cases = 0
    for kind in ("text", "chat"):
        for logprobs, top_k in ((False, None), (True, 0), (True, 3)):
            for echo_only in (False, True):
                w = _writer(kind, logprobs, echo_only)
                for finish in (None, "stop", "length", "abort"):
                    c = _random_output(rng, rng.randrange(1, 6), top_k, finish)
                    for start in range(len(c.token_ids)):
                        for end in (start, start + 1, len(c.token_ids)):
                            ids, text = c.token_ids[start:end], rng.choice(["", c.text, '"\\\u2028\x7f'])
                            offset = rng.randrange(100)
                            got = w.envelope + w._choice(5, c, ids, start, text, offset)[0].encode() + CHUNK_END
                            assert got == _reference(w, 5, c, ids, start, text, offset), (kind, logprobs, finish)
                            cases += 1
    assert cases > 200


def test_negative_control_a_reordered_field_shows():
    from samebits.server.responses import _sse

    w = _writer("text", False)
    c = _random_output(__import__("random").Random(SEED), 3, None, "length")
    swapped = {"index": 5, "text": c.text, "finish_reason": "length", "logprobs": None, "token_ids": c.token_ids}
    ours = w.envelope + w._choice(5, c, c.token_ids, 0, c.text, 0)[0].encode() + CHUNK_END
    assert ours != _sse({**w._head(), "choices": [swapped]})
    assert ours == _reference(w, 5, c, c.token_ids, 0, c.text, 0)


def test_completion_logprobs_offsets_and_alternatives():
    from samebits.server.responses import completion_logprobs

    tok = TOKEN_TEXTS.__getitem__
    ids = [4, 0, 5, 1, 2]
    got = completion_logprobs(tok, ids, [-1.0] * 5, [{}, {3: -2.0, 8: -0.5, 0: -1.0}, [], [(2, -1.0)], {}], 7)
    starts = [7 + sum(len(TOKEN_TEXTS[t]) for t in ids[:i]) for i in range(len(ids))]
    assert got["text_offset"] == starts and got["tokens"] == [TOKEN_TEXTS[t] for t in ids]
    # Each step's sampled token is among its alternatives (logprobs=0: it alone), as in OpenAI's and vLLM's. ids 8 and
    # 0 share the text "a": the dict keeps the place of the better (first, by -0.5) and the later value.
    assert got["top_logprobs"] == [{"你好": -1.0}, {"a": -1.0, "\n\t\x01": -2.0}, {"🙂": -1.0},
                                   {"\\": -1.0, ' "q"': -1.0}, {"\\": -1.0}]
    assert list(got["top_logprobs"][1]) == ["a", "\n\t\x01"]
    assert completion_logprobs(tok, [], [], [], 3)["text_offset"] == []


def _logprob_cases(rng):
    """(ids, logprobs, alternatives, offset): none, empty (logprobs=0), dicts or pairs, and every special float."""
    specials = [float("-inf"), float("inf"), float("nan"), -0.0, 0.0, -1e-45, -3.4028234663852886e38, -0.1]
    for _ in range(300):
        k = rng.randrange(0, 5)
        ids = [rng.randrange(len(TOKEN_TEXTS)) for _ in range(k)]
        lps = [rng.choice(specials) if rng.random() < 0.3 else -rng.random() * 30 for _ in ids]
        tops = rng.choice([None, [{} for _ in ids], [[] for _ in ids],
                           [{rng.randrange(len(TOKEN_TEXTS)): -rng.random() for _ in range(rng.randrange(3))}
                            for _ in ids]])
        yield ids, lps, tops, rng.randrange(1000)


def test_completion_logprobs_json_equals_the_encoder_on_the_dict():
    """The chunks' written-out logprobs (the fast path for none or empty alternatives, and the fallback) equal
    dumps(completion_logprobs(...)) byte for byte."""
    import random

    from samebits.server.responses import completion_logprobs, completion_logprobs_json

    w = _writer("text", True)
    rng = random.Random(SEED)
    for ids, lps, tops, offset in _logprob_cases(rng):
        want = dumps(completion_logprobs(w.state.token_text, ids, lps, tops, offset))
        got, chars = completion_logprobs_json(w.state, ids, lps, tops, offset)
        assert got == want, (ids, lps, tops)
        assert chars == sum(len(TOKEN_TEXTS[t]) for t in ids)


def test_negative_control_a_float_written_otherwise_shows():
    """The check above catches a one-character difference: floats written with %.17g instead of the encoder's
    repr (-0.1 becomes -0.10000000000000001) are reported."""
    import random

    import pytest

    from samebits.server import responses

    w = _writer("text", True)
    rng = random.Random(SEED)
    mp = pytest.MonkeyPatch()
    mp.setattr(responses, "lp_json", lambda v: f"{responses.lp(v):.17g}")
    try:
        differ = sum(responses.completion_logprobs_json(w.state, ids, lps, tops, offset)[0]
                     != dumps(responses.completion_logprobs(w.state.token_text, ids, lps, tops, offset))
                     for ids, lps, tops, offset in _logprob_cases(rng))
    finally:
        mp.undo()
    assert differ > 0
