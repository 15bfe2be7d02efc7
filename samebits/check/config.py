"""`CheckConfig`: every knob of `samebits check`, validated once so the experiments can trust it."""
from __future__ import annotations

import math
from dataclasses import dataclass

from samebits.check.constrained import CONSTRAINED

EXPERIMENTS = ("needle", "sampled", "prefix", "prefill", "repeat")
APIS = ("completions", "chat")


def _positive_int(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


def _positive_float(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value <= 0:
        raise ValueError(f"{name} must be a positive number, got {value!r}")


@dataclass(frozen=True)
class CheckConfig:
    url: str
    model: str | None = None
    api_key: str | None = None
    api: str = "completions"
    experiments: tuple[str, ...] = EXPERIMENTS
    concurrency: tuple[int, ...] = (1, 4, 16, 64, 128)
    trials: int = 3
    max_tokens: int = 16
    needle_words: int = 24
    filler_words: tuple[int, int] = (4, 48)
    prefix_words: int = 96
    temperature: float = 0.8
    seed: int = 0
    tolerance: float = 0.0
    max_requests: int = 5000
    max_wall_s: float = 900.0
    request_timeout_s: float = 120.0
    retries: int = 4
    # Structured output on every request (constrained.py): none, json (response_format) or mixed (vLLM's).
    constrained: str = "none"

    def __post_init__(self) -> None:
        if not self.url.startswith(("http://", "https://")):
            raise ValueError(f"url must start with http:// or https://, got {self.url!r}")
        if self.api not in APIS:
            raise ValueError(f"api must be one of {', '.join(APIS)}, got {self.api!r}")
        if self.constrained not in CONSTRAINED:
            raise ValueError(f"constrained must be one of {', '.join(CONSTRAINED)}, got {self.constrained!r}")
        self._check_experiments()
        self._check_sizes()
        self._check_numbers()

    def _check_experiments(self) -> None:
        unknown = [e for e in self.experiments if e not in EXPERIMENTS]
        if unknown or not self.experiments:
            raise ValueError(f"experiments must be a non-empty subset of {', '.join(EXPERIMENTS)}, got "
                             f"{', '.join(self.experiments) or 'none'}")
        if len(set(self.experiments)) != len(self.experiments):
            raise ValueError(f"experiments must not repeat, got {', '.join(self.experiments)}")

    def _check_sizes(self) -> None:
        if not self.concurrency:
            raise ValueError("concurrency must list at least one level")
        for n in self.concurrency:
            _positive_int("each concurrency level", n)
        if list(self.concurrency) != sorted(set(self.concurrency)):
            raise ValueError(f"concurrency must be increasing without repeats, got {list(self.concurrency)}")
        for name in ("trials", "max_tokens", "needle_words", "prefix_words", "max_requests"):
            _positive_int(name, getattr(self, name))
        if isinstance(self.retries, bool) or not isinstance(self.retries, int) or self.retries < 0:
            raise ValueError(f"retries must be a non-negative integer, got {self.retries!r}")
        lo, hi = self.filler_words
        _positive_int("filler_words min", lo)
        if hi < lo:
            raise ValueError(f"filler_words must be (min, max) with min <= max, got {self.filler_words}")

    def _check_numbers(self) -> None:
        _positive_float("temperature", self.temperature)
        _positive_float("max_wall_s", self.max_wall_s)
        _positive_float("request_timeout_s", self.request_timeout_s)
        if not math.isfinite(self.tolerance) or self.tolerance < 0:
            raise ValueError(f"tolerance must be a finite number >= 0, got {self.tolerance!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ValueError(f"seed must be a non-negative integer, got {self.seed!r}")

    @property
    def base_url(self) -> str:
        """The URL with `/v1` appended once, whether the user gave the server root or its /v1."""
        root = self.url.rstrip("/")
        return root if root.endswith("/v1") else root + "/v1"
