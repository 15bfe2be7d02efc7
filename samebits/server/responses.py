"""RequestOutputs -> OpenAI responses: JSON bodies, and the SSE stream whose chunks concatenate to the same body.

Logprobs are float32 values held in Python floats; `json.dumps` writes the shortest repr that round-trips the float64,
and a float64 holding a float32 value converts back to the same float32 bits, so the bits survive the trip.
"""
from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from dataclasses import dataclass
from json.encoder import encode_basestring

from starlette.responses import Response

from samebits.server.errors import map_error
from samebits.server.requests import Job, Sub
from samebits.server.state import ServerState

# JSON has no -inf; OpenAI-compatible servers send this instead (vLLM does the same).
NEG_INF_LOGPROB = -9999.0


# One encoder for every body and chunk: json.dumps with these options builds a new one per call, which costs more
# than encoding a token's logprobs.
_ENCODER = json.JSONEncoder(ensure_ascii=False, separators=(",", ":"), allow_nan=False)


def dumps(obj) -> str:
    return _ENCODER.encode(obj)


def lp(value: float) -> float:
    value = float(value)
    return value if math.isfinite(value) else NEG_INF_LOGPROB


def lp_json(value: float) -> str:
    """lp(value) as the encoder writes it: float.__repr__, the JSON encoder's own."""
    value = float(value)
    return repr(value) if value - value == 0.0 else _NEG_INF_JSON  # inf - inf and nan - nan are nan


_NEG_INF_JSON = repr(NEG_INF_LOGPROB)


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens,
            "prompt_tokens_details": {"cached_tokens": cached_tokens}}


# ---- logprobs -------------------------------------------------------------------------------------------------------
def completion_logprobs(tok: Callable[[int], str], ids: list[int], lps: list[float],
                        tops: list[dict] | None, offset: int) -> dict:
    """The legacy completions shape: parallel lists of tokens, logprobs, top alternatives and text offsets."""
    tokens = [tok(t) for t in ids]
    offsets = list(itertools.accumulate([len(s) for s in tokens[:-1]], initial=offset)) if tokens else []
    # logprobs=0 leaves every step's alternatives empty: the common case, which needs no sort.
    top = None if tops is None else [{tok(k): lp(v) for k, v in _items(d)} if d else {} for d in tops]
    return {"tokens": tokens, "token_logprobs": [lp(v) for v in lps], "top_logprobs": top, "text_offset": offsets}


def completion_logprobs_json(state: ServerState, ids: list[int], lps: list[float], tops: list | None,
                             offset: int) -> tuple[str, int]:
    """(dumps(completion_logprobs(...)), the tokens' text length), written out for a chunk where alternatives are
    none or empty (logprobs=0): one cached JSON string per token, no dicts (tests/server/test_responses.py holds the
    two equal). The length is where the next chunk's text_offset starts."""
    if tops and any(tops):
        return (dumps(completion_logprobs(state.token_text, ids, lps, tops, offset)),
                sum(map(len, map(state.token_text, ids))))
    tokens, offsets, at = [], [], offset
    for t in ids:
        token, length = state.token_json(t)
        tokens.append(token)
        offsets.append(str(at))
        at += length
    top = "null" if tops is None else f"[{','.join(['{}'] * len(tops))}]"
    text = (f'{{"tokens":[{",".join(tokens)}],"token_logprobs":[{",".join(map(lp_json, lps))}],'
            f'"top_logprobs":{top},"text_offset":[{",".join(offsets)}]}}')
    return text, at - offset


def prompt_completion_logprobs(tok: Callable[[int], str], ids: list[int], plp, k: int) -> dict:
    """echo's prompt part in the legacy shape, `plp` the engine's PromptLogprobs with k alternatives per token:
    nothing predicts the first token, so its logprob and alternatives are null, as in OpenAI's and vLLM's."""
    lps, top = [None], [None]
    for i, t in enumerate(ids[1:], start=1):
        step = plp[i]
        lps.append(lp(step[t].logprob))
        top.append({tok(u): lp(r.logprob) for u, r in step.items() if r.rank <= k})  # the token only if among them
    return {**completion_logprobs(tok, ids, [], None, 0), "token_logprobs": lps, "top_logprobs": top}


def joined_logprobs(prompt: dict, completion: dict) -> dict:
    """echo with logprobs: the prompt's lists, then the completion's."""
    return {key: prompt[key] + (completion[key] or []) for key in prompt}


def vllm_prompt_logprobs(tok: Callable[[int], str], plp) -> list:
    """vLLM's JSON of prompt_logprobs: null, then per prompt token {token_id: {logprob, rank, decoded_token}}."""
    return [None] + [{str(t): {"logprob": lp(r.logprob), "rank": r.rank, "decoded_token": tok(t)}
                      for t, r in step.items()} for step in plp[1:]]


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
    hold = max((_overlap(text[:end], s) for s in stops), default=0) if stops else 0
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
    # The sent tokens' own text lengths summed: where the next token's text_offset starts, counted as the body counts
    # it (completion_logprobs), not from `text`, which holds back a split character or a stop string's beginning.
    chars: int = 0

    def advance(self, out, stops: list[str]) -> tuple[list[int], int, str] | None:
        """New (token_ids, first index, text) since the last call, or None when nothing new is sendable."""
        if self.done:
            return None
        finished = out.finish_reason is not None
        safe = out.text
        if not finished and (stops or safe.endswith("\ufffd")):  # else all of it is final: no call
            safe = safe_text(safe, stops, finished)
        delta = safe[len(self.text):] if safe.startswith(self.text) else ""
        start, ids = self.tokens, list(out.token_ids[self.tokens:])
        if not ids and not delta and not finished:
            return None
        self.tokens += len(ids)
        self.text += delta
        self.done = finished
        return ids, start, delta


def json_response(obj: dict, headers: dict[str, str], status: int = 200) -> Response:
    return Response(dumps(obj), status_code=status, headers=headers, media_type="application/json")


# ---- bodies ----------------------------------------------------------------------------------------------------
def _usage(outs: list) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return usage(prompt, completion, sum(o.num_cached_tokens or 0 for o in outs))


def _choice_index(job: Job, i: int, c) -> int:
    return i * job.params.n + c.index


def _text_logprobs(state: ServerState, c, ids: list[int], start: int, offset: int) -> dict | None:
    if c.token_logprobs is None:
        return None
    tops = None if c.top_logprobs is None else c.top_logprobs[start:start + len(ids)]
    return completion_logprobs(state.token_text, ids, c.token_logprobs[start:start + len(ids)], tops, offset)


def _chat_logprobs(state: ServerState, c, ids: list[int], start: int) -> dict | None:
    if c.token_logprobs is None:
        return None
    tops = None if c.top_logprobs is None else c.top_logprobs[start:start + len(ids)]
    return chat_logprobs(state.token_text, ids, c.token_logprobs[start:start + len(ids)], tops)


def _prompt_text(state: ServerState, sub: Sub) -> str:
    return sub.text if sub.text is not None else state.tokenizer.decode(sub.ids, skip_special_tokens=False)


def _echo_logprobs(state: ServerState, job: Job, sub: Sub, out) -> dict | None:
    """The prompt part of echo's logprobs (None without logprobs)."""
    if not (job.echo and job.logprobs):
        return None
    if out.prompt_logprobs is None:
        raise RuntimeError(f"{out.request_id}: an output without the prompt logprobs it asked for")
    return prompt_completion_logprobs(state.token_text, sub.ids, out.prompt_logprobs, job.params.prompt_logprobs)


def _answer(job: Job, c) -> tuple[list[int], str]:
    """A choice's tokens and text; none with echo and max_tokens=0 (the token drawn to get there is dropped)."""
    return ([], "") if job.echo_only else (list(c.token_ids), c.text)


def text_body(state: ServerState, job: Job, outs: list) -> dict:
    choices = []
    for i, out in enumerate(outs):
        prefix = _prompt_text(state, job.subs[i]) if job.echo else ""
        echoed = _echo_logprobs(state, job, job.subs[i], out)
        for c in out.outputs:
            ids, text = _answer(job, c)
            lps = _text_logprobs(state, c, ids, 0, len(prefix)) if job.logprobs else None
            choice = {"index": _choice_index(job, i, c), "text": prefix + text,
                      "logprobs": joined_logprobs(echoed, lps) if echoed else lps, "finish_reason": c.finish_reason,
                      "stop_reason": c.stop_reason, "token_ids": ids}
            if job.prompt_logprobs:  # vLLM's place: the choice
                choice["prompt_logprobs"] = vllm_prompt_logprobs(state.token_text, out.prompt_logprobs)
            choices.append(choice)
    choices.sort(key=lambda ch: ch["index"])
    return {**job.meta.head("text_completion"), "choices": choices, "usage": _usage(outs)}


def _reply(job: Job, c) -> tuple[dict, str | None]:
    """(message, finish_reason) of a finished chat choice; with tools, its calls read out (server/tools.py)."""
    if job.tools is None:
        return {"role": "assistant", "content": c.text}, c.finish_reason
    return job.tools.reply(c.text, c.finish_reason)


def chat_body(state: ServerState, job: Job, outs: list) -> dict:
    replies = [_reply(job, c) for c in outs[0].outputs]
    choices = [{"index": c.index, "message": message,
                "logprobs": _chat_logprobs(state, c, c.token_ids, 0) if job.logprobs else None,
                "finish_reason": finish, "stop_reason": c.stop_reason, "token_ids": list(c.token_ids)}
               for c, (message, finish) in zip(outs[0].outputs, replies)]
    body = {**job.meta.head("chat.completion"), "choices": choices, "usage": _usage(outs)}
    if job.prompt_logprobs:  # vLLM's place: the response, beside the choices
        body["prompt_logprobs"] = vllm_prompt_logprobs(state.token_text, outs[0].prompt_logprobs)
    return body


class StreamWriter:
    """Cumulative outputs -> SSE chunks whose deltas concatenate to exactly the non-streamed response."""

    def __init__(self, state: ServerState, job: Job):
        self.state = state
        self.job = job
        self.cursors: dict[int, ChoiceCursor] = {}
        self.last: dict[int, object] = {}
        # echo with logprobs waits for each prompt's first output, which brings its prompt logprobs.
        self.echo_waits = job.kind == "text" and job.echo and job.logprobs
        self.prefix_len: dict[int, int] = {}
        # Every token's chunk starts the same: `data: ` and the head up to the choices list, rendered from the same
        # head as the other chunks and encoded once, not again per token.
        self.envelope = ("data: " + dumps({**self._head(), "choices": []})[:-2]).encode()
        # Where a choice's text goes: {"index":i,"text":"..." or {"index":i,"delta":{"content":"..."}.
        self.text_key, self.text_end = ('"text":', "") if job.kind == "text" else ('"delta":{"content":', "}")
        # What every token reads of the job, in one attribute each.
        self.n, self.stops, self.logprobs, self.echo_only = job.params.n, job.stops, job.logprobs, job.echo_only
        self.chat = job.kind == "chat"

    def opening(self) -> list[bytes]:
        """The events before any output's: chat's role deltas, or the echoed prompts when they need no output."""
        return [_sse(chunk) for chunk in self._opening()]

    def closing(self) -> list[bytes]:
        """The events after the last output's: the usage chunk, if asked for."""
        return [_sse(chunk) for chunk in self._closing()]

    def _head(self) -> dict:
        return self.job.meta.head("text_completion" if self.job.kind == "text" else "chat.completion.chunk")

    # One choice per chunk, as OpenAI and vLLM stream n > 1: clients that read chunk.choices[0] see every choice.
    def _chunks(self, choices: list[dict]) -> list[dict]:
        return [{**self._head(), "choices": [choice]} for choice in choices]

    def _opening(self) -> list[dict]:
        job, n = self.job, self.job.params.n
        if job.kind == "chat":
            return self._chunks([{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                  "finish_reason": None} for j in range(n)])
        if not job.echo or self.echo_waits:
            return []
        return [chunk for i in range(len(job.subs)) for chunk in self._echo(i, None)]

    def _echo(self, i: int, out) -> list[dict]:
        """The echoed prompt of sub i, one chunk per choice; with its logprobs when `out` brings them."""
        sub, n = self.job.subs[i], self.job.params.n
        text = _prompt_text(self.state, sub)
        self.prefix_len[i] = len(text)
        lps = None if out is None else _echo_logprobs(self.state, self.job, sub, out)
        return self._chunks([{"index": i * n + j, "text": text, "logprobs": lps, "finish_reason": None,
                              "token_ids": []} for j in range(n)])

    def feed(self, i: int, out) -> list[bytes]:
        """The events of sub i's latest output: its echo if due, then one chunk per choice with something new."""
        self.last[i] = out
        events = [_sse(c) for c in self._echo(i, out)] if self.echo_waits and i not in self.prefix_len else []
        first, cursors = i * self.n, self.cursors
        for c in out.outputs:
            index = first + c.index
            cursor = cursors.get(index)
            if cursor is None:
                cursor = cursors[index] = ChoiceCursor()
            step = cursor.advance(c, self.stops)
            if step is not None:
                choice, chars = self._choice(index, c, step[0], step[1], step[2],
                                             self.prefix_len.get(i, 0) + cursor.chars)
                events.append(self.envelope + choice.encode() + CHUNK_END)
                cursor.chars += chars
        return events

    def _choice(self, index: int, c, ids: list[int], start: int, text: str, offset: int) -> tuple[str, int]:
        """(One choice's JSON, its tokens' text length for text_offset), written out: the JSON encoder on a dict,
        as the other chunks are, costs several times as much per token (tests/server/test_responses.py holds the
        two equal)."""
        finish = c.finish_reason if c.finish_reason is not None and start + len(ids) == len(c.token_ids) else None
        if self.echo_only:  # the one token drawn to get the prompt scored is not part of the answer
            ids, text = [], ""
        lps_json, chars = "null", 0
        if self.logprobs and c.token_logprobs is not None:
            end = start + len(ids)
            if self.chat:  # no text_offset: the length is not needed
                lps_json = dumps(_chat_logprobs(self.state, c, ids, start))
            else:
                tops = None if c.top_logprobs is None else c.top_logprobs[start:end]
                lps_json, chars = completion_logprobs_json(self.state, ids, c.token_logprobs[start:end], tops, offset)
        finish_json = "null" if finish is None else encode_basestring(finish)
        choice = (f'{{"index":{index},{self.text_key}{encode_basestring(text)}{self.text_end},"logprobs":{lps_json},'
                  f'"finish_reason":{finish_json},"token_ids":[{",".join(map(str, ids))}]}}')
        return choice, chars

    def _closing(self) -> list[dict]:
        if not self.job.include_usage:
            return []
        outs = [self.last[i] for i in sorted(self.last)]
        return [{**self._head(), "choices": [], "usage": _usage(outs)}]


def _sse(obj: dict) -> bytes:
    return f"data: {dumps(obj)}\n\n".encode()


def error_event(e: BaseException) -> bytes:
    """An error mid-stream: the status is already 200, so it travels as an event (then [DONE])."""
    return _sse(map_error(e).body())


DONE_EVENT = b"data: [DONE]\n\n"
CHUNK_END = b"]}\n\n"  # a token chunk after its one choice: the choices list, the chunk, the event
