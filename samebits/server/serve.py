"""`serve(config)`: build the engine under the deployment template and run the app on uvicorn."""
from __future__ import annotations

import contextlib
import socket
import threading
import time

from samebits.server.config import ServerConfig


class ServeError(RuntimeError):
    """The server cannot start; the message says why and what to do."""


def uvicorn_config(app, config: ServerConfig, **overrides):
    import uvicorn

    # h11, not httptools: its incomplete-event limit bounds the raw header block. It is set above the middleware's
    # limit so that a slightly large header block gets the JSON 431 and only a huge one meets h11's bare 400.
    values = {"host": config.host, "port": config.port, "http": "h11", "loop": "asyncio", "lifespan": "on",
              "log_level": config.log_level, "timeout_keep_alive": config.timeout_keep_alive,
              "h11_max_incomplete_event_size": 2 * config.max_header_bytes, "server_header": False,
              "timeout_graceful_shutdown": 30}
    values.update(overrides)
    return uvicorn.Config(app, **values)


def build_async_engine(config: ServerConfig):
    from samebits.engine.async_engine import AsyncEngine
    from samebits.engine.llm_engine import LLMEngine

    return AsyncEngine(LLMEngine(config.engine), max_waiting=config.engine.max_waiting)


@contextlib.contextmanager
def template(config: ServerConfig):
    """The deterministic deployment template for the whole life of the server (nothing in fast mode)."""
    if config.engine.mode != "deterministic":
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


class ServerThread:
    """uvicorn in a background thread on a socket bound before it starts (port 0 = a free port, no race); for
    tests and benchmarks that drive a real server from the same process."""

    def __init__(self, app, config: ServerConfig, start_timeout_s: float = 60.0):
        import uvicorn

        self.sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self.sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self.sock.bind((config.host, config.port))
        self.server = uvicorn.Server(uvicorn_config(app, config))
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="samebits-uvicorn")
        self.thread.start()
        self._wait_started(start_timeout_s)
        host, port = self.sock.getsockname()[:2]
        self.url = f"http://{host}:{port}"

    def _wait_started(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while not self.server.started:
            if time.monotonic() > deadline or not self.thread.is_alive():
                raise ServeError("uvicorn did not start")
            time.sleep(0.02)

    def stop(self, timeout_s: float = 30.0) -> None:
        self.server.should_exit = True
        self.thread.join(timeout_s)
        if self.thread.is_alive():
            raise ServeError("uvicorn did not stop")
