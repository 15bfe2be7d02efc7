"""Real uvicorn servers on 127.0.0.1 (a socket bound to port 0, so no port races), one per fixture."""
from __future__ import annotations

from dataclasses import dataclass

import httpx
import pytest

from samebits.engine.async_engine import AsyncEngine
from samebits.server.app import build_app
from samebits.server.config import ServerConfig
from samebits.server.serve import ServerThread
from tests.server.fake_engine import FakeLLMEngine

MODEL_NAME = "tiny"


@dataclass
class LiveServer:
    url: str
    app: object
    async_engine: AsyncEngine
    config: ServerConfig
    thread: ServerThread

    @property
    def engine(self):
        return self.async_engine.engine

    def client(self, **kw) -> httpx.Client:
        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 60), **kw)

    def healthy(self) -> bool:
        return httpx.get(f"{self.url}/health", timeout=10).status_code == 200

    def stop(self) -> None:
        self.thread.stop()


def start_server(engine, **overrides) -> LiveServer:
    config = ServerConfig(**{"model": MODEL_NAME, "port": 0, "log_level": "warning", **overrides})
    async_engine = AsyncEngine(engine, max_waiting=config.max_waiting)
    app = build_app(async_engine, config)
    thread = ServerThread(app, config)
    return LiveServer(thread.url, app, async_engine, config, thread)


def make_engine(model_dir):
    """The one place that decides which engine the shared server runs: the real one on a tiny random model."""
    from samebits.engine.config import EngineConfig
    from samebits.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(model_dir), mode="deterministic", device="cpu", max_num_seqs=128,
                                  max_model_len=256))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from samebits.models.testing import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), variant="llama3", seed=0)


@pytest.fixture(scope="session")
def server(tiny_model_dir):
    live = start_server(make_engine(tiny_model_dir), max_n=16)
    yield live
    live.stop()


@pytest.fixture
def fake_server(request):
    """A fresh server on the FakeLLMEngine; parametrise with indirect=True to pass ServerConfig overrides."""
    overrides = dict(getattr(request, "param", {}) or {})
    engine_kw = overrides.pop("engine", {})
    live = start_server(FakeLLMEngine(**engine_kw), **overrides)
    yield live
    live.stop()
