"""`serve(config)`: build the engine under the deployment template and run the app on uvicorn."""
from __future__ import annotations

import contextlib
import logging
import socket
import threading
import time
from pathlib import Path

from samebits.server.config import ServerConfig

log = logging.getLogger("samebits.serve")


class ServeError(RuntimeError):
    """The server cannot start; the message says why and what to do."""


class EngineLost(ServeError):
    """The server stopped because its engine died past its restarts (server/supervisor.py): exit status 1."""


def uvicorn_config(app, config: ServerConfig, **overrides):
    import uvicorn

    from samebits.server.connections import ConnectionLimits, guarded_protocol

    # h11, not httptools: its incomplete-event limit bounds the raw header block. It is set above the middleware's
    # limit so that a slightly large header block gets the JSON 431 and only a huge one meets h11's bare 400.
    # Our subclass of uvicorn's h11 protocol adds the header and body deadlines and the connection cap.
    state = getattr(getattr(app, "state", None), "samebits", None)  # build_app's; absent for a bare ASGI app
    limits = ConnectionLimits(config.timeout_header, config.timeout_body, config.max_connections,
                              config.timeout_write, state.metrics.write_timeouts.inc if state is not None else None)
    values = {"host": config.host, "port": config.port, "http": guarded_protocol(limits), "loop": "asyncio",
              "lifespan": "on", "log_level": config.log_level, "timeout_keep_alive": config.timeout_keep_alive,
              "h11_max_incomplete_event_size": 2 * config.max_header_bytes, "server_header": False,
              "timeout_graceful_shutdown": 30, "access_log": not config.disable_log_requests}
    values.update(overrides)
    return uvicorn.Config(app, **values)


def build_async_engine(config: ServerConfig, loaded=None):
    """The engine behind the server: a thread beside the event loop, or its own process (`engine_process`, None
    resolved for the engine's device); `loaded`: the LoadedModel, or for an engine process a picklable factory of it
    (None: load `config.engine.model`)."""
    from samebits.models.loader import default_device

    if config.engine.data_parallel_size > 1:
        from samebits.fleet.engine import FleetEngine

        return FleetEngine(config.engine, max_waiting=config.engine.max_waiting,
                           max_waiting_tokens=config.max_waiting_tokens)
    if config.uses_engine_process(config.engine.device or default_device()):
        from samebits.engine.engine_process import ProcessAsyncEngine

        return ProcessAsyncEngine(config.engine, loaded, max_waiting=config.engine.max_waiting,
                                  max_waiting_tokens=config.max_waiting_tokens)
    from samebits.engine.async_engine import AsyncEngine
    from samebits.engine.llm_engine import LLMEngine

    return AsyncEngine(LLMEngine(config.engine, loaded), max_waiting=config.engine.max_waiting,
                       max_waiting_tokens=config.max_waiting_tokens)


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


def bind_socket(config: ServerConfig) -> socket.socket:
    """The server's listening address, taken now: a busy port is an error in a second, not after the model loads."""
    family = socket.AF_INET6 if ":" in config.host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((config.host, config.port))
    except OSError as e:
        sock.close()
        raise ServeError(f"cannot listen on {config.host}:{config.port}: {e.strerror}; stop what holds it or pass "
                         "another --port") from None
    return sock


def socket_url(sock: socket.socket) -> str:
    host, port = sock.getsockname()[:2]
    return f"http://[{host}]:{port}" if sock.family == socket.AF_INET6 else f"http://{host}:{port}"


def startup_line(engine, config: ServerConfig, url: str) -> str:
    """One line saying what answers on `url`: the model and its source, the numerics, the sizes, the fingerprint."""
    from samebits.models import hub
    from samebits.models.loader import source_kind

    info = engine.info()
    source = f"{source_kind(Path(info.model_path))} {info.model_path}"
    if config.engine.model in hub.BUILTIN:
        source = f"built-in, {source}"
    blocks, block = info.num_blocks, info.block_size
    dtype = str(info.dtype).removeprefix("torch.")
    fp = engine.fingerprint()
    where = "its own process" if config.uses_engine_process(info.device) else "a thread"
    if config.engine.data_parallel_size > 1:
        where = f"{config.engine.data_parallel_size} replicas on Ray"
    return (f"serving {config.model_name!r} on {url}: model {info.model_name} ({source}), mode {info.mode}, "
            f"dtype {dtype}, device {info.device} (engine in {where}), context {info.max_model_len} tokens, "
            f"KV cache {blocks} blocks x {block} = {blocks * block} tokens, weights {fp.get('weights')}, "
            f"fingerprint {fp['hash']}")


def _configure_logging(level: str) -> None:
    """samebits' own lines on stderr, in uvicorn's format and at its --log-level."""
    from uvicorn.config import LOG_LEVELS
    from uvicorn.logging import DefaultFormatter

    root = logging.getLogger("samebits")
    root.setLevel(LOG_LEVELS[level])
    if not root.handlers:
        handler = logging.StreamHandler()
        handler.setFormatter(DefaultFormatter("%(levelprefix)s %(message)s"))
        root.addHandler(handler)


TRUST_REMOTE_CODE_NOTE = ("--trust-remote-code is not needed: samebits runs no code from a checkpoint (its models "
                          "are its own), so the flag changes nothing")


def serve(config: ServerConfig) -> None:
    import uvicorn

    from samebits.models.loader import default_device, resolve_device, resolve_path, source_kind
    from samebits.server.app import build_app

    _configure_logging(config.log_level)
    if config.trust_remote_code:
        log.warning(TRUST_REMOTE_CODE_NOTE)
    # Everything that can be refused in a second (port, device, model path) is checked before the seconds of loading.
    sock = bind_socket(config)
    url = socket_url(sock)
    try:
        resolve_device(config.engine.device or default_device())
        _, path = resolve_path(config.engine.model)
        kind = source_kind(path)
        with template(config):
            log.info("loading %s (%s %s, mode %s)", config.engine.model, kind, path, config.engine.mode)
            async_engine = build_async_engine(config)
            log.info(startup_line(async_engine.engine, config, url))
            app = build_app(async_engine, config)
            server = uvicorn.Server(uvicorn_config(app, config))
            supervisor = stop_when_engine_lost(app, server)
            try:
                server.run(sockets=[sock])
            finally:
                async_engine.shutdown()  # also when uvicorn never started its lifespan: an engine process ends here
            if supervisor.gave_up:
                raise EngineLost(f"the server stopped: {supervisor.gave_up}")
    finally:
        sock.close()


def stop_when_engine_lost(app, server):
    """When the supervisor gives up on the engine, uvicorn stops as on SIGTERM; returns the supervisor."""
    supervisor = app.state.samebits.supervisor

    def stop() -> None:
        server.should_exit = True

    supervisor.on_give_up = stop
    return supervisor


class ServerThread:
    """uvicorn in a background thread on a socket bound before it starts (port 0 = a free port, no race); for
    tests and benchmarks that drive a real server from the same process."""

    def __init__(self, app, config: ServerConfig, start_timeout_s: float = 60.0, stop_when_lost: bool = False):
        """`stop_when_lost`: stop uvicorn when the engine supervisor gives up, as `serve` exits then."""
        import uvicorn

        self.sock = bind_socket(config)
        self.server = uvicorn.Server(uvicorn_config(app, config))
        if stop_when_lost:
            stop_when_engine_lost(app, self.server)
        self.thread = threading.Thread(target=self.server.run, kwargs={"sockets": [self.sock]}, daemon=True,
                                       name="samebits-uvicorn")
        self.thread.start()
        self._wait_started(start_timeout_s)
        self.url = socket_url(self.sock)

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
