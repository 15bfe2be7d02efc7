"""Incremental text: what a stream may send before a request finishes."""
from __future__ import annotations

from types import SimpleNamespace

from samebits.server.responses import ChoiceCursor, dumps, lp, safe_text


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
