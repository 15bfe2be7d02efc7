"""Request models of the OpenAI API subset samebits serves, and their checks.

Pydantic checks types (strict: "5" is not an int, true is not a number); `check_*` functions check values against the
server's limits with messages that name the field and the limit. Unknown fields are ignored, as OpenAI does.
"""
from __future__ import annotations

import math

from pydantic import BaseModel, ConfigDict

from samebits.server.errors import invalid

SEED_MAX = 2**63 - 1
ROLES = ("system", "developer", "user", "assistant", "tool")


class _Base(BaseModel):
    model_config = ConfigDict(extra="ignore", strict=True)


class StreamOptions(_Base):
    include_usage: bool = False


class _Sampling(_Base):
    """Fields shared by both endpoints."""

    model: str
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    min_p: float | None = None
    seed: int | None = None
    n: int | None = None
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    user: str | None = None
    # Accepted so clients that always send them work; anything but the neutral value is refused, never ignored.
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    logit_bias: dict[str, float] | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None
    suffix: str | None = None


class ContentPart(_Base):
    type: str
    text: str | None = None


class ChatMessage(_Base):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None


class ChatRequest(_Sampling):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None


def _finite(name: str, value: float | None) -> None:
    if value is not None and not math.isfinite(value):
        raise invalid(f"{name} must be a finite number, got {value!r}", name)


def _check_temperature_top(req: _Sampling) -> None:
    _finite("temperature", req.temperature)
    if req.temperature is not None and req.temperature < 0:
        raise invalid(f"temperature must be >= 0, got {req.temperature}", "temperature")
    _finite("top_p", req.top_p)
    if req.top_p is not None and not 0 < req.top_p <= 1:
        raise invalid(f"top_p must be in (0, 1], got {req.top_p}", "top_p")
    _finite("min_p", req.min_p)
    if req.min_p is not None and not 0 <= req.min_p <= 1:
        raise invalid(f"min_p must be in [0, 1], got {req.min_p}", "min_p")
    if req.top_k is not None and req.top_k < -1:
        raise invalid(f"top_k must be -1 (disabled), 0 (disabled) or >= 1, got {req.top_k}", "top_k")


def _check_seed_n(req: _Sampling, max_n: int) -> None:
    if req.seed is not None and not 0 <= req.seed <= SEED_MAX:
        raise invalid(f"seed must be in [0, {SEED_MAX}], got {req.seed}", "seed")
    if req.n is not None and not 1 <= req.n <= max_n:
        raise invalid(f"n must be in [1, {max_n}] (this server's maximum), got {req.n}", "n")


def _check_stop(req: _Sampling, max_stop: int, vocab_size: int) -> None:
    stops = stop_list(req.stop)
    if len(stops) > max_stop:
        raise invalid(f"stop may hold at most {max_stop} strings, got {len(stops)}", "stop")
    if any(s == "" for s in stops):
        raise invalid("stop strings must not be empty", "stop")
    ids = req.stop_token_ids or []
    if len(ids) > max_stop:
        raise invalid(f"stop_token_ids may hold at most {max_stop} ids, got {len(ids)}", "stop_token_ids")
    check_token_ids(ids, vocab_size, "stop_token_ids")


def _check_unsupported(req: _Sampling) -> None:
    for name in ("presence_penalty", "frequency_penalty"):
        value = getattr(req, name)
        if value not in (None, 0, 0.0):
            raise invalid(f"{name} is not supported by samebits; send 0 or leave it out (got {value})", name)
    if req.logit_bias:
        raise invalid("logit_bias is not supported by samebits; leave it out", "logit_bias")


def check_sampling(req: _Sampling, max_n: int, max_stop: int, vocab_size: int) -> None:
    _check_temperature_top(req)
    _check_seed_n(req, max_n)
    _check_stop(req, max_stop, vocab_size)
    _check_unsupported(req)


def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def check_token_ids(ids: list[int], vocab_size: int, param: str) -> None:
    for t in ids:
        if not 0 <= t < vocab_size:
            raise invalid(f"{param}: token id {t} is outside the vocabulary [0, {vocab_size})", param)


def check_max_tokens(value: int | None, param: str) -> None:
    if value is not None and value < 1:
        raise invalid(f"{param} must be at least 1, got {value}", param)


def check_logprobs(value: int | None, limit: int, param: str) -> None:
    if value is not None and not 0 <= value <= limit:
        raise invalid(f"{param} must be in [0, {limit}], got {value}", param)


def check_completion(req: CompletionRequest, max_logprobs: int) -> None:
    check_max_tokens(req.max_tokens, "max_tokens")
    check_logprobs(req.logprobs, max_logprobs, "logprobs")
    if req.echo and req.logprobs is not None:
        raise invalid("echo together with logprobs is not supported (no prompt logprobs)", "echo")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise invalid(f"best_of must equal n ({req.n or 1}) in samebits, got {req.best_of}", "best_of")
    if req.suffix:
        raise invalid("suffix is not supported by samebits; leave it out", "suffix")


def check_chat(req: ChatRequest, max_logprobs: int) -> None:
    check_max_tokens(req.max_tokens, "max_tokens")
    check_max_tokens(req.max_completion_tokens, "max_completion_tokens")
    check_logprobs(req.top_logprobs, max_logprobs, "top_logprobs")
    if req.top_logprobs and not req.logprobs:
        raise invalid("top_logprobs needs logprobs set to true", "top_logprobs")
    if not req.messages:
        raise invalid("messages must hold at least one message", "messages")
    for i, m in enumerate(req.messages):
        _check_message(i, m)


def _check_message(i: int, m: ChatMessage) -> None:
    if m.role not in ROLES:
        raise invalid(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.role!r}", "messages")
    if isinstance(m.content, list):
        for part in m.content:
            if part.type != "text" or part.text is None:
                raise invalid(f"messages[{i}].content: only text parts are supported, got type {part.type!r}",
                              "messages")


def message_dicts(messages: list[ChatMessage]) -> list[dict]:
    """Messages as the chat template expects them: text content joined, None content as ''."""
    return [{"role": m.role, "content": _text(m.content), **({"name": m.name} if m.name else {})} for m in messages]


def _text(content: str | list[ContentPart] | None) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "".join(p.text or "" for p in content)

