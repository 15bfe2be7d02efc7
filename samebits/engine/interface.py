"""The engine as a server sees it, declared once: `ServedEngine`, what the server holds and calls (AsyncEngine over an
LLMEngine, ProcessAsyncEngine over an engine process, fleet/engine.py's FleetEngine over replicas), and
`EngineFacts`, what it reads of `served.engine` (LLMEngine itself, or engine_process.py's EngineView where the engine
runs elsewhere). The server's tests run fakes of EngineFacts behind a real AsyncEngine (tests/server/fake_engine.py)."""
from __future__ import annotations

from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol, runtime_checkable

from samebits.engine.async_engine import Counters
from samebits.engine.outputs import EngineInfo, EngineStats, RequestOutput


@runtime_checkable
class EngineFacts(Protocol):
    """What the server reads of the engine it serves: tokenizer, limits, identity, seeds and the prompt check."""

    tokenizer: Any
    max_model_len: int

    def fingerprint(self) -> dict:
        """The numerics identity (runtime/fingerprint.py); its hash is on every answer."""

    def info(self) -> EngineInfo:
        """Model, mode, dtype, device and KV pool: the startup line and the admin route's dtype."""

    def stats(self) -> EngineStats:
        """The scheduler's counts and the token totals, for the metrics."""

    def draw_seed(self) -> int:
        """The next seed of the engine's one seed stream (engine/seeds.py), for a request that sends none."""

    def validate(self, prompt_token_ids: list[int], params, where: str = "prompt") -> None:
        """Token ids and context length checked before anything is queued; a ValueError naming the field."""


@runtime_checkable
class ServedEngine(Protocol):
    """What the server holds: requests in, cumulative outputs out, admission, health and lifecycle."""

    engine: EngineFacts
    stats: EngineStats | None
    # Latency hooks the server's metrics set (async_engine.py says when each is called).
    on_first_output: Callable[[float], None] | None
    on_finished: Callable[[float], None] | None
    on_step: Callable[[float, list], None] | None

    @property
    def healthy(self) -> bool:
        """False once the engine has died or is stopping."""

    @property
    def counters(self) -> Counters:
        """Requests rejected and the like, for the metrics."""

    def start(self) -> None:
        """Bind to the running event loop and start serving (idempotent)."""

    def shutdown(self, timeout: float = 10.0) -> None:
        """Stop serving; pending requests fail."""

    def health(self) -> dict:
        """What /health adds to its status (a fleet's replicas)."""

    def check_admission(self, seqs: int, tokens: int) -> None:
        """RequestTooLarge if work of this size could never wait here, QueueFull if it cannot now."""

    def generate(self, request_id: str, prompt_token_ids: list[int], params, prompt: str | None = None, *,
                 final_only: bool = False, resume=None) -> AsyncIterator[RequestOutput]:
        """The request's cumulative RequestOutput as it progresses; the last has `finished` set."""

    async def command(self, name: str, *args) -> Any:
        """An engine command run between steps (async_engine.py ENGINE_COMMANDS: the weight updates)."""
