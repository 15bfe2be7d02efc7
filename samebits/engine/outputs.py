"""What the engine hands back: one RequestOutput per request, one CompletionOutput per sample."""
from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class StepResult:
    """What one step drew for one sequence, read back to the host."""

    token_id: int
    logprob: float
    top_logprobs: dict[int, float]


@dataclass
class CompletionOutput:
    index: int
    text: str
    token_ids: list[int]
    # Sampled token's logprob per step; python floats that are exactly float32 values, so bits survive JSON.
    logprobs: list[float] | None = None
    # Per step: {token_id: logprob} for the top-k alternatives when SamplingParams.logprobs > 0.
    top_logprobs: list[dict[int, float]] | None = None
    cumulative_logprob: float | None = None
    # "stop" | "length" | "abort" | None while running.
    finish_reason: str | None = None
    # The stop string or stop token id that ended the sample (None for eos, length or running).
    stop_reason: str | int | None = None

    def finished(self) -> bool:
        return self.finish_reason is not None


@dataclass
class RequestOutput:
    request_id: str
    prompt: str | None
    prompt_token_ids: list[int]
    outputs: list[CompletionOutput] = field(default_factory=list)
    num_cached_tokens: int = 0
    seed: int | None = None
    fingerprint: str | dict | None = None
    finished: bool = False


@dataclass
class EngineStats:
    """What LLMEngine.stats() reports each step; the server's metrics read exactly these fields."""

    num_running: int
    num_waiting: int
    kv_usage: float
    prefix_queries: int
    prefix_hits: int
    num_preemptions: int
    prompt_tokens: int
    generation_tokens: int
