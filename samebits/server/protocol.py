"""Request models of the OpenAI API subset samebits serves: the body's shape, nothing more.

Pydantic checks types (strict: "5" is not an int, true is not a number); `requests` checks values. The typed fields
are the implemented ones; every object keeps its other fields (`model_extra`) for the field policy (`fields`), which
refuses each with a 400 unless it is sent with a neutral value or changes no output.
"""
from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class _Base(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


class StreamOptions(_Base):
    include_usage: bool = False


class JsonSchemaFormat(_Base):
    name: str | None = None
    description: str | None = None
    schema_: dict[str, Any] | None = Field(None, alias="schema")  # `schema` would shadow pydantic's own attribute
    strict: bool | None = None


class ResponseFormat(_Base):
    type: str
    json_schema: JsonSchemaFormat | None = None


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
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    min_tokens: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    repetition_penalty: float | None = None
    logit_bias: dict[str, float] | None = None  # OpenAI's JSON: token ids as strings
    allowed_token_ids: list[int] | None = None
    prompt_logprobs: int | None = None  # vLLM's: the prompt tokens' logprobs and that many alternatives
    # Structured outputs (server/structured.py): OpenAI's response_format, vLLM's structured_outputs and guided_*.
    response_format: ResponseFormat | None = None
    structured_outputs: dict[str, Any] | None = None
    guided_json: str | dict[str, Any] | None = None
    guided_regex: str | None = None
    guided_choice: list[str] | None = None
    guided_grammar: str | None = None
    guided_decoding_backend: str | None = None
    guided_whitespace_pattern: str | None = None


class CompletionRequest(_Sampling):
    prompt: str | list[str] | list[int] | list[list[int]]
    max_tokens: int | None = 16
    logprobs: int | None = None
    echo: bool | None = False
    best_of: int | None = None


class ContentPart(_Base):
    type: str
    text: str | None = None


class FunctionCall(_Base):
    name: str
    arguments: str  # a JSON object as text, as OpenAI sends it


class MessageToolCall(_Base):
    id: str | None = None
    type: str = "function"
    function: FunctionCall


class ChatMessage(_Base):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[MessageToolCall] | None = None  # an assistant's calls, replayed
    tool_call_id: str | None = None  # a tool result's call


class FunctionDef(_Base):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class Tool(_Base):
    type: str
    function: FunctionDef


class ChatRequest(_Sampling):
    messages: list[ChatMessage]
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    logprobs: bool | None = False
    top_logprobs: int | None = None
    add_generation_prompt: bool = True
    continue_final_message: bool = False
    chat_template_kwargs: dict[str, Any] | None = None
    tools: list[Tool] | None = None  # server/tools.py
    tool_choice: str | dict[str, Any] | None = None
    parallel_tool_calls: bool | None = None
