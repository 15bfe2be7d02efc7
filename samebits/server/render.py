"""RequestOutputs -> OpenAI response bodies and stream chunks (plain dicts, serialised by `dumps`).

Logprobs are float32 values held in Python floats; `json.dumps` writes the shortest repr that round-trips the float64,
and a float64 holding a float32 value converts back to the same float32 bits, so the bits survive the trip.
"""
from __future__ import annotations

import json
import math
from collections.abc import Callable
from dataclasses import dataclass

# JSON has no -inf; OpenAI-compatible servers send this instead (vLLM does the same).
NEG_INF_LOGPROB = -9999.0


def dumps(obj) -> str:
    return json.dumps(obj, ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def lp(value: float) -> float:
    value = float(value)
    return value if math.isfinite(value) else NEG_INF_LOGPROB


@dataclass
class Meta:
    """What every body of one response shares."""

    id: str
    created: int
    model: str
    system_fingerprint: str
    seed: int

    def head(self, obj: str) -> dict:
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.system_fingerprint, "seed": self.seed}


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


# ---- logprobs -------------------------------------------------------------------------------------------------------
def completion_logprobs(tok: Callable[[int], str], ids: list[int], lps: list[float],
                        tops: list[dict] | None, offset: int) -> dict:
    """The legacy completions shape: parallel lists of tokens, logprobs, top alternatives and text offsets."""
    tokens = [tok(t) for t in ids]
    offsets = []
    for s in tokens:
        offsets.append(offset)
        offset += len(s)
    top = None if tops is None else [{tok(k): lp(v) for k, v in _items(d)} for d in tops]
    return {"tokens": tokens, "token_logprobs": [lp(v) for v in lps], "top_logprobs": top, "text_offset": offsets}


def chat_logprobs(tok: Callable[[int], str], ids: list[int], lps: list[float], tops: list[dict] | None) -> dict:
    content = []
    for i, (t, v) in enumerate(zip(ids, lps)):
        alts = [] if tops is None else [_chat_token(tok(k), w) for k, w in _items(tops[i])]
        content.append({**_chat_token(tok(t), v), "top_logprobs": alts})
    return {"content": content, "refusal": None}


def _chat_token(s: str, v: float) -> dict:
    return {"token": s, "logprob": lp(v), "bytes": list(s.encode("utf-8"))}


def _items(d) -> list:
    """Top alternatives as (token_id, logprob), best first; accepts a dict or a list of pairs."""
    pairs = list(d.items()) if isinstance(d, dict) else [tuple(p) for p in d]
    return sorted(pairs, key=lambda p: -p[1])


# ---- incremental text ----------------------------------------------------------------------------------------------
def safe_text(text: str, stops: list[str], finished: bool) -> str:
    """The prefix of `text` that can no longer change: not a trailing partial UTF-8 character, not a possible
    beginning of a stop string (the engine cuts stop strings off once they are complete)."""
    if finished:
        return text
    end = len(text)
    while end > 0 and text[end - 1] == "\ufffd":
        end -= 1
    hold = max((_overlap(text[:end], s) for s in stops), default=0)
    return text[:end - hold]


def _overlap(text: str, stop: str) -> int:
    for k in range(min(len(stop) - 1, len(text)), 0, -1):
        if text.endswith(stop[:k]):
            return k
    return 0


@dataclass
class ChoiceCursor:
    """How much of one choice a stream has sent so far."""

    tokens: int = 0
    text: str = ""
    done: bool = False

    def advance(self, out, stops: list[str]) -> tuple[list[int], int, str] | None:
        """New (token_ids, first index, text) since the last call, or None when nothing new is sendable."""
        if self.done:
            return None
        finished = out.finish_reason is not None
        safe = safe_text(out.text, stops, finished)
        delta = safe[len(self.text):] if safe.startswith(self.text) else ""
        start, ids = self.tokens, list(out.token_ids[self.tokens:])
        if not ids and not delta and not finished:
            return None
        self.tokens += len(ids)
        self.text += delta
        self.done = finished
        return ids, start, delta
