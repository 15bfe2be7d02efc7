"""The two generation endpoints: parse, check against the model's limits, run on the AsyncEngine, render."""
from __future__ import annotations

import asyncio
import contextlib
import re
import secrets
import time
import uuid
from dataclasses import dataclass

from pydantic import BaseModel, ValidationError
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from samebits import __version__
from samebits.engine.async_engine import EngineDead, QueueFull
from samebits.engine.sampling_params import SamplingParams
from samebits.server import render
from samebits.server.errors import APIError, engine_dead, invalid, not_found, queue_full, too_large, validation_message
from samebits.server.metrics import Metrics
from samebits.server.protocol import (
    SEED_MAX,
    ChatRequest,
    CompletionRequest,
    check_chat,
    check_completion,
    check_sampling,
    check_token_ids,
    message_dicts,
    stop_list,
)
from samebits.server.streaming import ClientGone, SSEResponse, merged, race_disconnect

# A union field's pydantic errors name each member; the client needs one sentence.
UNION_HINTS = {
    "prompt": "prompt must be a string, a list of strings, a list of token ids or a list of token-id lists",
    "stop": "stop must be a string or a list of strings",
}
STATUS_CLIENT_GONE = 499  # nginx's convention; nobody reads it, but logs and metrics do


@dataclass
class Sub:
    """One engine request of an HTTP request (a completion request with a list of prompts has several)."""

    request_id: str
    ids: list[int]
    text: str | None


@dataclass
class Job:
    kind: str  # "text" | "chat"
    meta: render.Meta
    subs: list[Sub]
    params: SamplingParams
    stops: list[str]
    echo: bool
    logprobs: bool
    include_usage: bool


def _header_value(value) -> str:
    text = "none" if value is None else str(value)
    return re.sub(r"[^\x20-\x7e]", "?", text)


def numerics_headers(fp: dict, mode: str) -> dict[str, str]:
    fields = {
        "Fingerprint": fp.get("hash"),
        "Engine-Version": fp.get("samebits", __version__),
        "Torch-Version": fp.get("torch"),
        "Cuda-Version": fp.get("cuda_runtime", fp.get("cuda")),
        "Cublas-Version": fp.get("cublas"),
        "Driver-Version": fp.get("driver"),
        "Kernel-Flags": fp.get("kernel_flags", fp.get("numerics_profile")),
        "Mode": fp.get("mode", mode),
    }
    return {f"X-Samebits-{k}": _header_value(v) for k, v in fields.items()}


def _error_param(message: str) -> str | None:
    m = re.match(r"^([a-z_]+)\b", message)
    return m.group(1) if m else None


def map_error(e: BaseException) -> APIError:
    """Engine-side exceptions -> what the client sees."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, QueueFull):
        return queue_full(e.limit)
    if isinstance(e, EngineDead):
        return engine_dead()
    if isinstance(e, ValueError):
        return invalid(str(e), _error_param(str(e)))
    return APIError(500, f"internal error: {type(e).__name__}", "server_error", None, "internal_error")


def _vocab_size(engine) -> int:
    # The model's vocabulary bounds token ids; the tokenizer's can be smaller (padded embeddings) or larger.
    model_config = getattr(getattr(engine, "loaded", None), "config", None)
    size = getattr(engine, "vocab_size", None) or getattr(model_config, "vocab_size", None)
    return int(size or engine.tokenizer.vocab_size)


class ServerState:
    def __init__(self, async_engine, config):
        engine = async_engine.engine
        self.ae = async_engine
        self.config = config
        self.tokenizer = engine.tokenizer
        self.max_model_len = int(engine.max_model_len)
        self.vocab_size = _vocab_size(engine)
        self.fingerprint = dict(engine.fingerprint())
        self.headers = numerics_headers(self.fingerprint, config.mode)
        self.metrics = Metrics(async_engine)
        self.created = int(time.time())
        self._token_text: dict[int, str] = {}

    @property
    def model_name(self) -> str:
        return self.config.model_name

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def check_model(self, model: str) -> None:
        if model not in (self.model_name, self.config.model):
            raise not_found(f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                            "model", "model_not_found")

    def check_context(self, prompt_len: int, max_tokens: int, where: str, param: str) -> None:
        limit = self.max_model_len
        if prompt_len >= limit:
            raise invalid(f"This model's maximum context length is {limit} tokens. However, your {where} has "
                          f"{prompt_len} tokens. Please reduce the length of the {where}.", param)
        if prompt_len + max_tokens > limit:
            raise invalid(f"This model's maximum context length is {limit} tokens. However, you requested "
                          f"{prompt_len + max_tokens} tokens ({prompt_len} in the {where}, {max_tokens} in the "
                          f"completion). Please reduce the length of the {where} or completion.", "max_tokens")


# ---- request body ----------------------------------------------------------------------------------------------
async def read_model(request: Request, model: type[BaseModel], limit: int) -> BaseModel:
    ctype = request.headers.get("content-type", "")
    if ctype.split(";")[0].strip().lower() != "application/json":
        raise APIError(415, f"Content-Type must be application/json, got {ctype or 'none'!r}.",
                       code="unsupported_media_type")
    body = await _read_body(request, limit)
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


# ---- building jobs ---------------------------------------------------------------------------------------------
def _new_meta(state: ServerState, prefix: str, seed: int) -> render.Meta:
    fp = str(state.fingerprint.get("hash", ""))
    return render.Meta(f"{prefix}-{uuid.uuid4().hex}", int(time.time()), state.model_name, fp, seed)


def _sampling_params(req, max_tokens: int, seed: int, logprobs: int | None) -> SamplingParams:
    top_k = -1 if req.top_k in (None, 0) else req.top_k
    try:
        return SamplingParams(
            temperature=1.0 if req.temperature is None else req.temperature,
            top_p=1.0 if req.top_p is None else req.top_p, top_k=top_k,
            min_p=0.0 if req.min_p is None else req.min_p, max_tokens=max_tokens, stop=stop_list(req.stop) or None,
            stop_token_ids=req.stop_token_ids, ignore_eos=req.ignore_eos, seed=seed, n=req.n or 1,
            logprobs=logprobs)
    except ValueError as e:
        raise invalid(str(e), _error_param(str(e))) from None


def _completion_prompts(state: ServerState, prompt) -> list[tuple[str | None, list[int]]]:
    items = [prompt] if isinstance(prompt, str) or (prompt and isinstance(prompt[0], int)) else list(prompt)
    if not items:
        raise invalid("prompt must not be empty", "prompt")
    if len(items) > state.config.max_prompts:
        raise invalid(f"prompt may hold at most {state.config.max_prompts} prompts, got {len(items)}", "prompt")
    return [_one_prompt(state, p) for p in items]


def _one_prompt(state: ServerState, p) -> tuple[str | None, list[int]]:
    ids = state.tokenizer.encode(p) if isinstance(p, str) else list(p)
    if not ids or p == "":
        raise invalid("prompt must not be empty (an empty string or an empty token list)", "prompt")
    if not isinstance(p, str):
        check_token_ids(ids, state.vocab_size, "prompt")
    return (p if isinstance(p, str) else None), ids


def _seed(req) -> int:
    # Drawn here, not in the engine, so every engine request of one HTTP request shares it and the header knows it.
    return req.seed if req.seed is not None else secrets.randbelow(SEED_MAX + 1)


def completion_job(state: ServerState, req: CompletionRequest) -> Job:
    cfg = state.config
    state.check_model(req.model)
    check_completion(req, cfg.max_logprobs)
    check_sampling(req, cfg.max_n, cfg.max_stop, state.vocab_size)
    prompts = _completion_prompts(state, req.prompt)
    max_tokens = 16 if req.max_tokens is None else req.max_tokens
    for _, ids in prompts:
        state.check_context(len(ids), max_tokens, "prompt", "prompt")
    seed = _seed(req)
    params = _sampling_params(req, max_tokens, seed, req.logprobs)
    meta = _new_meta(state, "cmpl", seed)
    subs = [Sub(f"{meta.id}-{i}", ids, text) for i, (text, ids) in enumerate(prompts)]
    return Job("text", meta, subs, params, stop_list(req.stop), bool(req.echo), req.logprobs is not None,
               _include_usage(req))


def _include_usage(req) -> bool:
    return bool(req.stream_options and req.stream_options.include_usage)


def _chat_ids(state: ServerState, req: ChatRequest) -> list[int]:
    messages = message_dicts(req.messages)
    try:
        text = state.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    # The template's own raise_exception (e.g. "roles must alternate") is the client's problem, whatever its type.
    except Exception as e:  # noqa: BLE001
        raise invalid(f"messages cannot be rendered by the chat template: {e}", "messages") from None
    return state.tokenizer.encode(text, add_special_tokens=False)


def chat_job(state: ServerState, req: ChatRequest) -> Job:
    cfg = state.config
    state.check_model(req.model)
    check_chat(req, cfg.max_logprobs)
    check_sampling(req, cfg.max_n, cfg.max_stop, state.vocab_size)
    ids = _chat_ids(state, req)
    requested = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
    max_tokens = requested if requested is not None else max(1, state.max_model_len - len(ids))
    state.check_context(len(ids), max_tokens, "messages", "messages")
    seed = _seed(req)
    logprobs = (req.top_logprobs or 0) if req.logprobs else None
    params = _sampling_params(req, max_tokens, seed, logprobs)
    meta = _new_meta(state, "chatcmpl", seed)
    return Job("chat", meta, [Sub(f"{meta.id}-0", ids, None)], params, stop_list(req.stop), False,
               bool(req.logprobs), _include_usage(req))


# ---- running jobs ----------------------------------------------------------------------------------------------
def _outputs(state: ServerState, job: Job, final_only: bool = False):
    """(sub-request index, cumulative output) pairs of all the job's engine requests."""
    def start(s: Sub):
        return state.ae.generate(s.request_id, s.ids, job.params, prompt=s.text, final_only=final_only)

    if len(job.subs) == 1:  # the common case skips the merging task and queue: one wake-up less per step
        return _single(start(job.subs[0]))
    return merged([lambda s=s: start(s) for s in job.subs], map_error)


async def _single(outputs):
    try:
        async with contextlib.aclosing(outputs) as it:
            async for out in it:
                yield 0, out
    except Exception as e:  # noqa: BLE001 - every engine-side error becomes an HTTP error
        raise map_error(e) from None


def _aborted() -> APIError:
    return APIError(503, "The request was aborted by the server before it finished.", "server_error", None, "aborted")


async def _collect(state: ServerState, job: Job) -> list:
    last: dict[int, object] = {}
    async with contextlib.aclosing(_outputs(state, job, final_only=True)) as outputs:
        async for i, out in outputs:
            last[i] = out
    if len(last) != len(job.subs) or not all(o.finished for o in last.values()):
        raise _aborted()
    return [last[i] for i in range(len(job.subs))]


def json_response(obj: dict, headers: dict[str, str], status: int = 200) -> Response:
    return Response(render.dumps(obj), status_code=status, headers=headers, media_type="application/json")


def _job_headers(job: Job) -> dict[str, str]:
    return {"X-Samebits-Seed": str(job.meta.seed)}


async def respond(state: ServerState, request: Request, job: Job, stream: bool) -> Response:
    if stream:
        return await _respond_stream(state, request, job)
    try:
        outs = await race_disconnect(_collect(state, job), request.receive)
    except ClientGone:
        state.metrics.disconnects.inc()
        return Response(status_code=STATUS_CLIENT_GONE)
    body = (text_body if job.kind == "text" else chat_body)(state, job, outs)
    return json_response(body, _job_headers(job))


async def _respond_stream(state: ServerState, request: Request, job: Job) -> Response:
    outputs = _outputs(state, job)
    try:
        # The first output is awaited before the 200 goes out, so a full queue or a bad request gets its status code.
        first = await race_disconnect(outputs.__anext__(), request.receive)
    except ClientGone:
        state.metrics.disconnects.inc()
        await outputs.aclose()
        return Response(status_code=STATUS_CLIENT_GONE)
    except StopAsyncIteration:
        raise _aborted() from None
    chunks = StreamWriter(state, job).events(first, outputs)
    return SSEResponse(chunks, _job_headers(job), state.metrics.disconnects.inc)


# ---- bodies ----------------------------------------------------------------------------------------------------
def _usage(outs: list) -> dict:
    prompt = sum(len(o.prompt_token_ids) for o in outs)
    completion = sum(len(c.token_ids) for o in outs for c in o.outputs)
    return render.usage(prompt, completion, sum(o.num_cached_tokens or 0 for o in outs))


def _choice_index(job: Job, i: int, c) -> int:
    return i * job.params.n + c.index


def _text_logprobs(state: ServerState, c, ids: list[int], start: int, offset: int) -> dict | None:
    if c.logprobs is None:
        return None
    tops = None if c.top_logprobs is None else c.top_logprobs[start:start + len(ids)]
    return render.completion_logprobs(state.token_text, ids, c.logprobs[start:start + len(ids)], tops, offset)


def _chat_logprobs(state: ServerState, c, ids: list[int], start: int) -> dict | None:
    if c.logprobs is None:
        return None
    tops = None if c.top_logprobs is None else c.top_logprobs[start:start + len(ids)]
    return render.chat_logprobs(state.token_text, ids, c.logprobs[start:start + len(ids)], tops)


def _prompt_text(state: ServerState, sub: Sub) -> str:
    return sub.text if sub.text is not None else state.tokenizer.decode(sub.ids, skip_special_tokens=False)


def text_body(state: ServerState, job: Job, outs: list) -> dict:
    choices = []
    for i, out in enumerate(outs):
        prefix = _prompt_text(state, job.subs[i]) if job.echo else ""
        for c in out.outputs:
            choices.append({"index": _choice_index(job, i, c), "text": prefix + c.text,
                            "logprobs": _text_logprobs(state, c, c.token_ids, 0, len(prefix)) if job.logprobs
                            else None, "finish_reason": c.finish_reason, "stop_reason": c.stop_reason,
                            "token_ids": list(c.token_ids)})
    choices.sort(key=lambda ch: ch["index"])
    return {**job.meta.head("text_completion"), "choices": choices, "usage": _usage(outs)}


def chat_body(state: ServerState, job: Job, outs: list) -> dict:
    choices = [{"index": c.index, "message": {"role": "assistant", "content": c.text},
                "logprobs": _chat_logprobs(state, c, c.token_ids, 0) if job.logprobs else None,
                "finish_reason": c.finish_reason, "stop_reason": c.stop_reason, "token_ids": list(c.token_ids)}
               for c in outs[0].outputs]
    return {**job.meta.head("chat.completion"), "choices": choices, "usage": _usage(outs)}


class StreamWriter:
    """Cumulative outputs -> SSE chunks whose deltas concatenate to exactly the non-streamed response."""

    def __init__(self, state: ServerState, job: Job):
        self.state = state
        self.job = job
        self.cursors: dict[int, render.ChoiceCursor] = {}
        self.last: dict[int, object] = {}

    async def events(self, first, outputs):
        try:
            for chunk in self._opening():
                yield _sse(chunk)
            for chunk in self._feed(*first):
                yield _sse(chunk)
            async for i, out in outputs:
                for chunk in self._feed(i, out):
                    yield _sse(chunk)
            for chunk in self._closing():
                yield _sse(chunk)
        except Exception as e:  # noqa: BLE001 - mid-stream: the status is already 200, so the error travels as an event
            yield _sse(map_error(e).body())
        finally:
            await outputs.aclose()
        yield b"data: [DONE]\n\n"

    def _head(self) -> dict:
        return self.job.meta.head("text_completion" if self.job.kind == "text" else "chat.completion.chunk")

    def _opening(self) -> list[dict]:
        job, n = self.job, self.job.params.n
        if job.kind == "chat":
            return [{**self._head(), "choices": [{"index": j, "delta": {"role": "assistant", "content": ""},
                                                  "logprobs": None, "finish_reason": None} for j in range(n)]}]
        if not job.echo:
            return []
        return [{**self._head(), "choices": [
            {"index": i * n + j, "text": _prompt_text(self.state, sub), "logprobs": None, "finish_reason": None,
             "token_ids": []} for i, sub in enumerate(job.subs) for j in range(n)]}]

    def _feed(self, i: int, out) -> list[dict]:
        self.last[i] = out
        choices = []
        for c in out.outputs:
            index = _choice_index(self.job, i, c)
            cursor = self.cursors.setdefault(index, render.ChoiceCursor())
            offset = len(cursor.text)
            step = cursor.advance(c, self.job.stops)
            if step is not None:
                choices.append(self._choice(index, c, *step, offset))
        return [{**self._head(), "choices": choices}] if choices else []

    def _choice(self, index: int, c, ids: list[int], start: int, text: str, offset: int) -> dict:
        finish = c.finish_reason if c.finish_reason is not None and start + len(ids) == len(c.token_ids) else None
        if self.job.kind == "chat":
            lps = _chat_logprobs(self.state, c, ids, start) if self.job.logprobs else None
            return {"index": index, "delta": {"content": text}, "logprobs": lps, "finish_reason": finish,
                    "token_ids": ids}
        lps = _text_logprobs(self.state, c, ids, start, offset) if self.job.logprobs else None
        return {"index": index, "text": text, "logprobs": lps, "finish_reason": finish, "token_ids": ids}

    def _closing(self) -> list[dict]:
        if not self.job.include_usage:
            return []
        outs = [self.last[i] for i in sorted(self.last)]
        return [{**self._head(), "choices": [], "usage": _usage(outs)}]


def _sse(obj: dict) -> bytes:
    return f"data: {render.dumps(obj)}\n\n".encode()


async def handle(state: ServerState, request: Request, model: type[BaseModel], build) -> Response:
    try:
        req = await read_model(request, model, state.config.max_body_bytes)
    except ClientDisconnect:
        state.metrics.disconnects.inc()
        return Response(status_code=STATUS_CLIENT_GONE)
    # Off the event loop: tokenising a megabyte prompt or rendering a chat template must not stall other streams.
    job = await asyncio.to_thread(build, state, req)
    return await respond(state, request, job, bool(req.stream))

