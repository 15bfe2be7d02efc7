"""Request models of the OpenAI API subset samebits serves: the body's shape, nothing more.

Pydantic checks types (strict: "5" is not an int, true is not a number); `requests` checks values. Unknown fields are
ignored, as OpenAI does.
"""
from __future__ import annotations

from pydantic import BaseModel, ConfigDict


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
