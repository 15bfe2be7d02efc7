"""Real uvicorn servers on 127.0.0.1 (a socket bound to port 0, so no port races), one per fixture."""
from __future__ import annotations

import importlib.util
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

# The GPU image has no server stack unless its wheels were carried: there these tests are left out, not errors.
_MISSING = [m for m in ("fastapi", "uvicorn", "pydantic", "starlette", "httpx", "prometheus_client")
            if importlib.util.find_spec(m) is None]
if _MISSING:
    collect_ignore_glob = ["test_*.py"]
elif importlib.util.find_spec("openai") is None:  # the openai client's tests, found by their import
    collect_ignore = [p.name for p in Path(__file__).parent.glob("test_*.py") if "import openai" in p.read_text()]

MODEL_NAME = "tiny"


@dataclass
class LiveServer:
    url: str
    app: Any
    async_engine: Any
    config: Any
    thread: Any

    @property
    def engine(self):
        return self.async_engine.engine

    def client(self, **kw):
        import httpx

        return httpx.Client(base_url=self.url, timeout=kw.pop("timeout", 60), **kw)

    def healthy(self) -> bool:
        import httpx

        return httpx.get(f"{self.url}/health", timeout=10).status_code == 200

    def stop(self) -> None:
        self.thread.stop()


def start_server(engine, **overrides) -> LiveServer:
    from samebits.engine.async_engine import AsyncEngine
    from samebits.server.app import build_app
    from samebits.server.config import ServerConfig
    from samebits.server.serve import ServerThread

    config = ServerConfig.from_dict({"model": MODEL_NAME, "port": 0, "log_level": "warning", **overrides})
    async_engine = AsyncEngine(engine, max_waiting=config.engine.max_waiting,
                               max_waiting_tokens=config.max_waiting_tokens)
    app = build_app(async_engine, config)
    thread = ServerThread(app, config)
    return LiveServer(thread.url, app, async_engine, config, thread)


def make_engine(model_dir, device: str = "cpu"):
    """The one place that decides which engine the shared server runs: the real one on a tiny random model."""
    from samebits.engine.config import EngineConfig
    from samebits.engine.llm_engine import LLMEngine

    return LLMEngine(EngineConfig(model=str(model_dir), mode="deterministic", device=device, max_num_seqs=128,
                                  max_model_len=256))


@pytest.fixture(scope="session")
def tiny_model_dir(tmp_path_factory):
    from samebits.models.synthetic import write_tiny_checkpoint

    return write_tiny_checkpoint(tmp_path_factory.mktemp("tiny-llama"), variant="llama3", seed=0)


@pytest.fixture(scope="session")
def server(tiny_model_dir):
    live = start_server(make_engine(tiny_model_dir), max_n=16)
    yield live
    live.stop()
