"""`ServerConfig`: every knob of `samebits serve`, one CLI flag per field."""
from __future__ import annotations

import ipaddress
from dataclasses import dataclass, fields

MODES = ("deterministic", "fast")


def _positive(name: str, value: int | None, allow_none: bool = False) -> None:
    if value is None and allow_none:
        return
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ValueError(f"{name} must be a positive integer, got {value!r}")


@dataclass(frozen=True)
class ServerConfig:
    model: str = "smollm2-135m"
    host: str = "127.0.0.1"
    port: int = 8000
    mode: str = "deterministic"
    api_keys: tuple[str, ...] = ()
    served_model_name: str | None = None
    device: str | None = None
    dtype: str | None = None
    max_model_len: int | None = None
    max_num_seqs: int = 256
    max_num_batched_tokens: int = 2048
    enable_prefix_caching: bool = True
    max_waiting: int = 1024
    max_n: int = 16
    max_logprobs: int = 20
    max_prompts: int = 64
    max_stop: int = 16
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_count: int = 64
    max_header_bytes: int = 16 * 1024
    timeout_keep_alive: int = 5
    log_level: str = "info"

    def __post_init__(self) -> None:
        self._check_address()
        if self.mode not in MODES:
            raise ValueError(f"mode must be one of {MODES}, got {self.mode!r}")
        if not self.model:
            raise ValueError("model must be a name or a path, got an empty string")
        self._check_keys()
        self._check_limits()

    def _check_address(self) -> None:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            if self.host != "localhost":
                raise ValueError(f"host must be an IP address or 'localhost', got {self.host!r}") from None
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise ValueError(f"port must be in [0, 65535], got {self.port!r}")

    def _check_keys(self) -> None:
        if not isinstance(self.api_keys, tuple):
            raise ValueError("api_keys must be a tuple of strings")  # noqa: TRY004 - config errors are ValueError
        if any(not isinstance(k, str) or not k for k in self.api_keys):
            raise ValueError("api_keys must be non-empty strings")

    def _check_limits(self) -> None:
        _positive("max_model_len", self.max_model_len, allow_none=True)
        for name in ("max_num_seqs", "max_num_batched_tokens", "max_waiting", "max_n", "max_prompts", "max_stop",
                     "max_body_bytes", "max_header_count", "max_header_bytes", "timeout_keep_alive"):
            _positive(name, getattr(self, name))
        if isinstance(self.max_logprobs, bool) or not isinstance(self.max_logprobs, int) or self.max_logprobs < 0:
            raise ValueError(f"max_logprobs must be a non-negative integer, got {self.max_logprobs!r}")

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model

    @classmethod
    def from_dict(cls, data: dict) -> ServerConfig:
        """Build from a plain mapping (a config file); unknown keys are an error, not silently dropped."""
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(data) - known)
        if unknown:
            raise ValueError(f"unknown ServerConfig keys: {', '.join(unknown)}")
        values = dict(data)
        if "api_keys" in values:
            values["api_keys"] = tuple(values["api_keys"])
        return cls(**values)
