"""`build_app(async_engine, server_config)`: the FastAPI application of `samebits serve`."""
from __future__ import annotations

import asyncio
import contextlib
import functools
import gc
import logging

from fastapi import FastAPI
from pydantic import BaseModel
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect, Request
from starlette.responses import Response

from samebits import __version__
from samebits.engine.async_engine import QueueFull, waiting_cost
from samebits.server.admin import add_admin_routes
from samebits.server.errors import (
    RETRY_AFTER_S,
    APIError,
    clip,
    engine_dead,
    error_response,
    internal_error,
    map_error,
    not_found,
)
from samebits.server.metrics import CONTENT_TYPE
from samebits.server.middleware import GuardMiddleware
from samebits.server.protocol import ChatRequest, CompletionRequest, DetokenizeRequest, TokenizeRequest
from samebits.server.requests import chat_job, completion_job, read_model
from samebits.server.responses import json_response
from samebits.server.run import STATUS_CLIENT_GONE, respond
from samebits.server.state import ServerState
from samebits.server.supervisor import DEAD, OK, STARTING
from samebits.server.tokenize import detokenize, tokenize, tokenizer_info

log = logging.getLogger("samebits.server")


def guarded(fn):
    """Turn APIError into its JSON and any other exception into a 500 JSON inside the app, so that even a server
    error passes the middleware and carries the numerics headers."""

    @functools.wraps(fn)
    async def wrapper(request: Request) -> Response:
        try:
            return await fn(request)
        except APIError as e:
            return error_response(e)
        except Exception:
            log.exception("internal error on %s", request.url.path)
            return error_response(internal_error())

    return wrapper


async def handle(state: ServerState, request: Request, model: type[BaseModel], build) -> Response:
    """One generation request: parse the body, build its Job, run it and respond."""
    try:
        req = await read_model(request, model, state.config.max_body_bytes, state.parse_turn)
    except ClientDisconnect:
        state.metrics.disconnects.inc()
        return Response(status_code=STATUS_CLIENT_GONE)
    state.check_text_size(req)
    # Off the event loop: tokenising a long prompt or rendering a chat template must not stall other streams (the
    # tokenizer releases the GIL: models/tokenizer.py).
    job = await asyncio.to_thread(build, state, req)
    _check_admission(state, job)
    return await respond(state, request, job, bool(req.stream))


def _check_admission(state: ServerState, job) -> None:
    """The whole request against the waiting limits before any of its prompts is queued: a request that can never
    fit is a 400, one that cannot fit now a 429, never a part of it run and the rest refused."""
    costs = [waiting_cost(len(sub.ids), job.params) for sub in job.subs]
    try:
        state.ae.check_admission(sum(c[0] for c in costs), sum(c[1] for c in costs))
    except (QueueFull, ValueError) as e:  # RequestTooLarge is a ValueError naming its field
        raise map_error(e) from None


def _lifespan(state: ServerState):
    @contextlib.asynccontextmanager
    async def lifespan(app):
        state.ae.start()
        # What exists by now (torch, the model, every import) lives as long as the server: the cyclic collector's
        # full passes skip it instead of walking it again every few thousand responses' allocations.
        gc.freeze()
        try:
            yield
        finally:
            gc.unfreeze()
            state.supervisor.stop()
            state.ae.shutdown()

    return lifespan


def _model_card(state: ServerState, name: str) -> dict:
    # root is the first served name: the real name, or the path it was loaded from, stays the operator's.
    return {"id": name, "object": "model", "created": state.created, "owned_by": "samebits",
            "root": state.model_name, "max_model_len": state.max_model_len}


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.post("/v1/completions")
    @guarded
    async def completions(request: Request) -> Response:
        return await handle(state, request, CompletionRequest, completion_job)

    @app.post("/v1/chat/completions")
    @guarded
    async def chat_completions(request: Request) -> Response:
        return await handle(state, request, ChatRequest, chat_job)

    @app.get("/v1/models")
    async def models() -> Response:
        # One card per served name, as vLLM lists them.
        return json_response({"object": "list", "data": [_model_card(state, n) for n in state.config.served_names]},
                             {})

    @app.get("/v1/models/{model:path}")
    @guarded
    async def model(request: Request) -> Response:
        state.check_model(request.path_params["model"])
        return json_response(_model_card(state, request.path_params["model"]), {})

    _add_tokenizer_routes(app, state)
    _add_ops_routes(app, state)


async def _tokenizer_call(state: ServerState, request: Request, model: type[BaseModel], answer) -> Response:
    try:
        req = await read_model(request, model, state.config.max_body_bytes, state.parse_turn)
    except ClientDisconnect:
        state.metrics.disconnects.inc()
        return Response(status_code=STATUS_CLIENT_GONE)
    return json_response(await asyncio.to_thread(answer, state, req), {})  # off the loop, as handle() tokenizes


def _add_tokenizer_routes(app: FastAPI, state: ServerState) -> None:
    """vLLM's tokenizer routes (server/tokenize.py), at the root as vLLM has them."""
    @app.post("/tokenize")
    @guarded
    async def tokenize_route(request: Request) -> Response:
        return await _tokenizer_call(state, request, TokenizeRequest, tokenize)

    @app.post("/detokenize")
    @guarded
    async def detokenize_route(request: Request) -> Response:
        return await _tokenizer_call(state, request, DetokenizeRequest, detokenize)

    @app.get("/tokenizer_info")
    async def tokenizer_info_route() -> Response:
        return json_response(tokenizer_info(state), {})


def _add_ops_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> Response:
        """Liveness: 200 while the server serves or its engine restarts ("starting"); 503 once it gave up."""
        return _probe(state, ready=False)

    @app.get("/ready")
    async def ready() -> Response:
        """Readiness: 200 only while the engine serves; 503 while it restarts, as when it is dead."""
        return _probe(state, ready=True)

    @app.get("/version")
    async def version() -> Response:
        # The same JSON as `samebits fingerprint --json` (it carries the samebits version itself).
        return json_response(state.fingerprint, {})

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)


def _probe(state: ServerState, ready: bool) -> Response:
    status = state.supervisor.status
    if status == DEAD:
        return error_response(engine_dead())
    if status == STARTING:
        body = {"status": STARTING, "restarts": state.supervisor.restarts, **state.ae.health()}  # a fleet's replicas
        return json_response(body, {"Retry-After": str(RETRY_AFTER_S)}, 503 if ready else 200)
    return json_response({"status": OK, **state.ae.health()}, {})


def _head_wherever_get(app: FastAPI) -> None:
    """HEAD is answered wherever GET is (the body dropped by the server), as HTTP asks: probes and caches use it."""
    for route in app.routes:
        methods = getattr(route, "methods", None)
        if methods and "GET" in methods:
            methods.add("HEAD")


def _add_handlers(app: FastAPI) -> None:
    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> Response:
        path = clip(request.url.path)
        if exc.status_code == 404:
            return error_response(not_found(f"No route for {request.method} {path}."))
        # Starlette's headers, e.g. the Allow of a 405.
        return error_response(APIError(exc.status_code, f"{exc.detail} ({request.method} {path})."), exc.headers)

    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> Response:
        return error_response(exc)


def build_app(async_engine, server_config) -> FastAPI:
    state = ServerState(async_engine, server_config)
    app = FastAPI(title="samebits", version=__version__, docs_url=None, redoc_url=None, openapi_url=None,
                  lifespan=_lifespan(state))
    app.state.samebits = state
    _add_routes(app, state)
    add_admin_routes(app, state)
    _head_wherever_get(app)
    _add_handlers(app)
    app.add_middleware(GuardMiddleware, numerics_headers=state.headers, api_keys=state.api_keys,
                       max_header_count=server_config.max_header_count,
                       max_header_bytes=server_config.max_header_bytes,
                       on_error=state.metrics.http_error)
    return app
