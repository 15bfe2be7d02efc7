"""An HTTP request -> a Job. Parse: the JSON body into its protocol model. Check: what SamplingParams cannot know (the
body's shape, this server's limits, the vocabulary). Build: prompt token ids and SamplingParams, whose construction
checks every sampling value, then the engine's own check of the prompts and the context length. Every ValueError of
those two becomes the OpenAI 400 naming the request's field."""
from __future__ import annotations

import asyncio
import re
import time
import uuid
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError
from starlette.requests import Request

from samebits.engine.prompts import render_chat
from samebits.engine.sampling_params import ContextLengthError, SamplingParams, check_vocab
from samebits.server.errors import APIError, clip, field_of, invalid, too_large, validation_message
from samebits.server.fields import check_fields
from samebits.server.json_keys import duplicate_key_error
from samebits.server.protocol import ChatMessage, ChatRequest, CompletionRequest
from samebits.server.state import ServerState
from samebits.server.structured import compiled, constraint
from samebits.server.tools import ToolPlan, tool_plan

# A union field's pydantic errors name each member; the client needs one sentence.
UNION_HINTS = {
    "prompt": "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "stop must be a string or a list of strings",
}
ROLES = ("system", "developer", "user", "assistant", "tool")
# A logit_bias key: ASCII digits, no sign, space, separator or leading zero. Ten digits hold any vocabulary's ids.
TOKEN_ID_KEY = re.compile(r"0|[1-9][0-9]*")
TOKEN_ID_KEY_DIGITS = 10


@dataclass
class Sub:
    """One engine request of an HTTP request (a completion request with a list of prompts has several)."""

    request_id: str
    ids: list[int]
    text: str | None


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


@dataclass
class Job:
    kind: str  # "text" | "chat"
    meta: Meta
    subs: list[Sub]
    params: SamplingParams
    stops: list[str]
    echo: bool
    logprobs: bool
    include_usage: bool
    # The response carries vLLM's prompt_logprobs (asked for, or on completions computed for echo, as vLLM's).
    prompt_logprobs: bool = False
    # echo with max_tokens=0: the prompt scored, the one token drawn to get there dropped (vLLM's and OpenAI's).
    echo_only: bool = False
    # Chat with tools: how the answer's text becomes tool calls (server/tools.py).
    tools: ToolPlan | None = None


# ---- parse -----------------------------------------------------------------------------------------------------
# A parse holds the event loop and the GIL for a time that grows with the body: eight 4 MB bodies parsed back to back
# kept /health waiting past its deadline on a 2-core machine (tests/server/test_hostile_inputs.py's health test).
# Bodies from this size on take turns, one parse at a time after a pass of the loop, so a probe waits for one at most.
BIG_BODY_BYTES = 1 << 20


async def read_model(request: Request, model: type[BaseModel], limit: int, turn: asyncio.Lock) -> BaseModel:
    """The body as `model`; `turn` is the server's lock that big bodies are parsed under (ServerState.parse_turn)."""
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"Content-Type must be application/json, got {ctype or 'none'!r}.",
                       code="unsupported_media_type")
    body = await _read_body(request, limit)
    if len(body) < BIG_BODY_BYTES:
        return _parse(model, body)
    async with turn:
        await asyncio.sleep(0)  # what became ready while this body waited (a /health probe) runs first
        return _parse(model, body)


def _parse(model: type[BaseModel], body: bytes) -> BaseModel:
    duplicate = duplicate_key_error(body)
    if duplicate is not None:
        raise duplicate
    try:
        return model.model_validate_json(body)
    except ValidationError as e:
        raise _validation_error(e) from None


async def _read_body(request: Request, limit: int) -> bytes:
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise too_large(limit)
    chunks, size = [], 0
    async for chunk in request.stream():
        size += len(chunk)
        if size > limit:
            raise too_large(limit)
        chunks.append(chunk)
    return b"".join(chunks)


def _validation_error(e: ValidationError) -> APIError:
    errors = e.errors(include_url=False)
    first = errors[0]
    if first.get("type") == "json_invalid":
        return invalid(f"The body is not valid JSON: {first.get('ctx', {}).get('error', first.get('msg'))}", None,
                       "invalid_json")
    message, param = validation_message(first)
    if param in UNION_HINTS and all(validation_message(x)[1] == param for x in errors):
        message = f"{UNION_HINTS[param]} (got {_got(first)})"
    return invalid(message, param)


def _got(error: dict) -> str:
    value = repr(error.get("input"))
    return value if len(value) <= 60 else value[:57] + "..."


# ---- check -----------------------------------------------------------------------------------------------------
def stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    return [stop] if isinstance(stop, str) else list(stop)


def _check_limits(req, max_n: int, max_stop: int, vocab_size: int) -> None:
    if req.n is not None and not 1 <= req.n <= max_n:
        raise invalid(f"n must be in [1, {max_n}] (this server's maximum), got {req.n}", "n")
    stops = stop_list(req.stop)
    if len(stops) > max_stop:
        raise invalid(f"stop may hold at most {max_stop} strings, got {len(stops)}", "stop")
    ids = req.stop_token_ids or []
    if len(ids) > max_stop:
        raise invalid(f"stop_token_ids may hold at most {max_stop} ids, got {len(ids)}", "stop_token_ids")
    for t in ids:
        if not 0 <= t < vocab_size:
            raise invalid(f"stop_token_ids: token id {t} is outside the vocabulary [0, {vocab_size})",
                          "stop_token_ids")
    if req.allowed_token_ids is not None and len(req.allowed_token_ids) > vocab_size:
        raise invalid(f"allowed_token_ids may hold at most {vocab_size} ids (the vocabulary)", "allowed_token_ids")


def _check_logprobs(value: int | None, limit: int, param: str) -> None:
    if value is not None and not 0 <= value <= limit:
        raise invalid(f"{param} must be in [0, {limit}], got {value}", param)


def _check_prompt_logprobs(req, max_logprobs: int) -> None:
    _check_logprobs(req.prompt_logprobs, max_logprobs, "prompt_logprobs")
    if req.prompt_logprobs is not None and req.stream:  # vLLM's chunks have no place for them either
        raise invalid("prompt_logprobs are not available with stream=true (for a completion, echo with logprobs "
                      "streams the prompt's)", "prompt_logprobs")


def _check_completion(req: CompletionRequest, max_logprobs: int) -> None:
    _check_logprobs(req.logprobs, max_logprobs, "logprobs")
    _check_prompt_logprobs(req, max_logprobs)
    if req.max_tokens == 0 and not req.echo:
        raise invalid("max_tokens must be >= 1 (0 is allowed with echo=true only: the prompt scored alone)",
                      "max_tokens")
    if req.best_of is not None and req.best_of != (req.n or 1):
        raise invalid(f"best_of must equal n ({req.n or 1}) in samebits, got {req.best_of}", "best_of")


def _check_chat(req: ChatRequest, max_logprobs: int) -> None:
    _check_logprobs(req.top_logprobs, max_logprobs, "top_logprobs")
    _check_prompt_logprobs(req, max_logprobs)
    if req.top_logprobs and not req.logprobs:
        raise invalid("top_logprobs needs logprobs set to true", "top_logprobs")
    if not req.messages:
        raise invalid("messages must hold at least one message", "messages")
    for i, m in enumerate(req.messages):
        _check_message(i, m)


def _check_message(i: int, m: ChatMessage) -> None:
    if m.role not in ROLES:
        raise invalid(f"messages[{i}].role must be one of {', '.join(ROLES)}, got {m.role!r}", "messages")


def _check_request(state: ServerState, req, endpoint: str) -> None:
    cfg = state.config
    state.check_model(req.model)
    check_fields(endpoint, req)
    _check_limits(req, cfg.max_n, cfg.max_stop, state.vocab_size)


# ---- build -----------------------------------------------------------------------------------------------------
def _sampling_params(req, max_tokens: int, seed: int, logprobs: int | None, fields: dict[str, str],
                     prompt_logprobs: int | None = None, structured=None) -> SamplingParams:
    """SamplingParams checks every value; its error names its own field, renamed to the request's by `fields`."""
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=-1 if req.top_k is None else req.top_k,
            min_p=0.0 if req.min_p is None else req.min_p, max_tokens=max_tokens, stop=stop_list(req.stop) or None,
            stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos, seed=seed, n=req.n or 1,
            logprobs=logprobs, include_stop_str_in_output=req.include_stop_str_in_output,
            skip_special_tokens=req.skip_special_tokens, prompt_logprobs=prompt_logprobs,
            structured_outputs=structured, **_adjustments(req))
    except ValueError as e:
        message, field = str(e), field_of(e)
        name = fields.get(field, field)
        raise invalid(name + message[len(field):] if field else message, name) from None


def _adjustments(req) -> dict:
    """The logits adjustments the request sets (unset ones keep SamplingParams' defaults)."""
    names = ("min_tokens", "presence_penalty", "frequency_penalty", "repetition_penalty", "allowed_token_ids")
    out = {name: getattr(req, name) for name in names if getattr(req, name) is not None}
    if req.logit_bias is not None:
        out["logit_bias"] = _logit_bias(req.logit_bias)
    return out


def _logit_bias(bias: dict[str, float]) -> dict[int, float]:
    """OpenAI's keys are token ids as strings: canonical decimals only, so "+5", "05", " 5", "1_0" or "٥" (which
    int() would take) are refused rather than read as an id the client may not mean; the vocabulary bound follows."""
    out = {}
    for key, value in bias.items():
        if not TOKEN_ID_KEY.fullmatch(key) or len(key) > TOKEN_ID_KEY_DIGITS:
            raise invalid(f"logit_bias keys must be token ids written as plain decimal integers (e.g. \"42\"), got "
                          f"{clip(key)!r}", "logit_bias")
        out[int(key)] = value
    return out


def _engine_checked(state: ServerState, subs: list[Sub], params: SamplingParams, where: str) -> None:
    """The engine's check of each prompt (token ids, context length), before any of them is queued."""
    try:
        check_vocab(params, state.vocab_size)
    except ValueError as e:
        raise invalid(str(e), field_of(e)) from None
    for sub in subs:
        try:
            state.engine.validate(sub.ids, params, where)
        except ContextLengthError as e:
            raise invalid(str(e), where if e.field == "prompt" else e.field) from None
        except ValueError as e:
            raise invalid(str(e), field_of(e)) from None


def _new_meta(state: ServerState, prefix: str, seed: int) -> Meta:
    return Meta(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), state.model_name, str(state.fingerprint["hash"]),
                seed)


def _completion_prompts(state: ServerState, prompt) -> list[tuple[str | None, list[int]]]:
    items = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else list(prompt)
    if not items:
        raise invalid("prompt must not be empty", "prompt")
    if len(items) > state.config.max_prompts:
        raise invalid(f"prompt may hold at most {state.config.max_prompts} prompts, got {len(items)}", "prompt")
    return [_one_prompt(state, p) for p in items]


def _one_prompt(state: ServerState, p) -> tuple[str | None, list[int]]:
    ids = state.encode_prompt(p) if isinstance(p, str) else list(p)
    if not ids or p == "":
        raise invalid("prompt must not be empty (an empty string or an empty token list)", "prompt")
    return (p if isinstance(p, str) else None), ids


def _seed(state: ServerState, req) -> int:
    return req.seed if req.seed is not None else state.draw_seed()


def _include_usage(req) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def completion_job(state: ServerState, req: CompletionRequest) -> Job:
    _check_request(state, req, "completions")
    _check_completion(req, state.config.max_logprobs)
    prompts = _completion_prompts(state, req.prompt)
    seed = _seed(state, req)
    echo_only = bool(req.echo) and req.max_tokens == 0
    max_tokens = 1 if echo_only else 16 if req.max_tokens is None else req.max_tokens
    # vLLM: echo with logprobs scores the prompt with as many alternatives, unless prompt_logprobs says otherwise.
    scored = req.prompt_logprobs if req.prompt_logprobs is not None else req.logprobs if req.echo else None
    structured, field = constraint(req)
    params = _sampling_params(req, max_tokens, seed, req.logprobs, {}, scored, structured)
    compiled(state, structured, field)
    meta = _new_meta(state, "cmpl", seed)
    subs = [Sub(f"{meta.id}-{i}", ids, text) for i, (text, ids) in enumerate(prompts)]
    _engine_checked(state, subs, params, "prompt")
    return Job("text", meta, subs, params, stop_list(req.stop), bool(req.echo), req.logprobs is not None,
               _include_usage(req), scored is not None, echo_only)


def chat_ids(state: ServerState, req, tools: list[dict] | None = None) -> list[int]:
    """The prompt ids of a request's messages and chat template fields (a chat request's, a /tokenize one's)."""
    messages = [m.model_dump(exclude_none=True) for m in req.messages]
    try:
        return render_chat(state.tokenizer, messages, req.add_generation_prompt, req.continue_final_message,
                           req.chat_template_kwargs, tools, state.config.tool_call_parser)
    except ValueError as e:
        raise invalid(str(e), field_of(e)) from None


def chat_job(state: ServerState, req: ChatRequest) -> Job:
    _check_request(state, req, "chat")
    _check_chat(req, state.config.max_logprobs)
    plan = tool_plan(req, state.config.tool_call_parser, state.tokenizer)
    ids = chat_ids(state, req, plan.tools if plan is not None else None)
    named = "max_completion_tokens" if req.max_completion_tokens is not None else "max_tokens"
    requested = getattr(req, named)
    max_tokens = requested if requested is not None else state.default_max_tokens(len(ids))
    seed = _seed(state, req)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    forced = plan.forced if plan is not None else None
    structured, field = constraint(req, (forced, "tool_choice") if forced is not None else None)
    params = _sampling_params(req, max_tokens, seed, logprobs, {"max_tokens": named, "logprobs": "top_logprobs"},
                              req.prompt_logprobs, structured)
    compiled(state, structured, "tools" if field == "tool_choice" else field)
    meta = _new_meta(state, "chatcmpl", seed)
    subs = [Sub(f"{meta.id}-0", ids, None)]
    _engine_checked(state, subs, params, "messages")
    return Job("chat", meta, subs, params, stop_list(req.stop), False, bool(req.logprobs), _include_usage(req),
               req.prompt_logprobs is not None, tools=plan)
