"""`serve(config)`: build the engine under the deployment template and run the app on uvicorn."""
from __future__ import annotations

import contextlib

from samebits.server.config import ServerConfig


class ServeError(RuntimeError):
    """The server cannot start; the message says why and what to do."""


def uvicorn_config(app, config: ServerConfig, **overrides):
    import uvicorn

    # h11, not httptools: its incomplete-event limit bounds the raw header block. It is set above the middleware's
    # limit so that a slightly large header block gets the JSON 431 and only a huge one meets h11's bare 400.
    values = dict(host=config.host, port=config.port, http="h11", loop="asyncio", lifespan="on",
                  log_level=config.log_level, timeout_keep_alive=config.timeout_keep_alive,
                  h11_max_incomplete_event_size=2 * config.max_header_bytes, server_header=False)
    values.update(overrides)
    return uvicorn.Config(app, **values)


def engine_config(config: ServerConfig):
    from samebits.engine.config import EngineConfig

    return EngineConfig(model=config.model, mode=config.mode, device=config.device, dtype=config.dtype,
                        max_num_seqs=config.max_num_seqs, max_num_batched_tokens=config.max_num_batched_tokens,
                        max_model_len=config.max_model_len, enable_prefix_caching=config.enable_prefix_caching)


def build_async_engine(config: ServerConfig):
    from samebits.engine.async_engine import AsyncEngine
    from samebits.engine.llm_engine import LLMEngine

    return AsyncEngine(LLMEngine(engine_config(config)), max_waiting=config.max_waiting)


@contextlib.contextmanager
def template(config: ServerConfig):
    """The deterministic deployment template for the whole life of the server (nothing in fast mode)."""
    if config.mode != "deterministic":
        yield
        return
    from samebits.runtime import RuntimeTemplateError, deterministic_runtime

    try:
        ctx = deterministic_runtime()
        ctx.__enter__()
    except RuntimeTemplateError as e:
        raise ServeError(f"refusing to start in deterministic mode: the deployment template cannot be applied: {e}"
                         ) from None
    try:
        yield
    finally:
        ctx.__exit__(None, None, None)


def serve(config: ServerConfig) -> None:
    import uvicorn

    from samebits.server.app import build_app

    with template(config):
        app = build_app(build_async_engine(config), config)
        uvicorn.Server(uvicorn_config(app, config)).run()
