"""`ServerConfig`: every knob of `samebits serve`; the engine's knobs are its `EngineConfig`, held, not re-listed."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass, fields
from pathlib import Path

from samebits.engine.config import EngineConfig
from samebits.errors import FieldError
from samebits.models.tool_parsers import TOOL_CALL_PARSERS

# A server bounds its waiting queue (429 past it, in sequences: prompts x n); the offline engine need not, so the
# server's default sets it. One batch's worth (max_num_seqs' default): a giant request cannot queue more than that.
SERVER_ENGINE = EngineConfig(max_waiting=256)


def _positive(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise FieldError(name, f"{name} must be a positive integer, got {value!r}")


def _positive_seconds(name: str, value) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value < float("inf"):
        raise FieldError(name, f"{name} must be a positive number of seconds, got {value!r}")


# The environment variable holding an API key (as vLLM reads VLLM_API_KEY): a key there or in a file never shows in
# `ps` or /proc/PID/cmdline, as an --api-key value does.
API_KEY_ENV = "SAMEBITS_API_KEY"
API_KEY_FLAG = "--api-key"
API_KEY_SOURCES = f"{API_KEY_FLAG}, --api-key-file or {API_KEY_ENV}"


# uvicorn's log levels (its --log-level); serve logs its own lines at the same level.
LOG_LEVELS = ("critical", "error", "warning", "info", "debug", "trace")


@dataclass(frozen=True)
class ServerConfig:
    engine: EngineConfig = SERVER_ENGINE
    host: str = "127.0.0.1"
    port: int = 8000
    api_keys: tuple[str, ...] = ()
    # A file of accepted keys, one a line (blank lines and lines starting with # skipped): keys outside argv.
    api_key_file: str | None = None
    # vLLM's: the names clients may send, the first reported in responses (a str is one name); (): --model's.
    served_model_name: tuple[str, ...] = ()
    max_n: int = 16
    max_logprobs: int = 20
    max_prompts: int = 64
    max_stop: int = 16
    max_body_bytes: int = 4 * 1024 * 1024
    max_header_count: int = 64
    max_header_bytes: int = 16 * 1024
    # Characters of prompt text (all prompts, or all messages) tokenized for one request; None: 32 per token of
    # context (state.py), far above any real text's 3-5, so only a prompt that cannot fit is refused untokenized.
    max_prompt_chars: int | None = None
    # Waiting work in tokens: each waiting sequence counts its prompt plus its max_tokens (the KV it will hold).
    max_waiting_tokens: int = 1024 * 1024
    # A chat request without max_tokens generates at most this many (not to the end of the context).
    default_max_tokens: int = 1024
    # User text may spell special tokens (<|im_end|>, <|eot_id|>...) only when the operator allows it (completions).
    allow_special_tokens: bool = False
    timeout_keep_alive: int = 5
    timeout_header: float = 10.0
    timeout_body: float = 30.0
    # A response that cannot be written for this long (the client reads nothing, its buffers are full) is cut and its
    # requests aborted (server/connections.py); a slow client that keeps reading is never cut.
    timeout_write: float = 30.0
    max_connections: int = 1024
    log_level: str = "info"
    # The engine in its own process (engine/engine_process.py): the server's Python work then never holds the GIL the
    # step needs. False: the engine thread in the server's process. None: the process on a CUDA device at
    # tensor_parallel_size 1 (as vLLM V1 runs its EngineCore; on the H200 it served more than the thread,
    # docs/BENCHMARKS.md §5), the thread otherwise (a CPU step's torch ops release the GIL; ranks need the thread).
    engine_process: bool | None = None
    # Times a dead engine process is restarted (same config, same fingerprint: server/supervisor.py) over the server's
    # life; at the next death the server exits non-zero, for systemd or Kubernetes to restart it whole.
    max_engine_restarts: int = 3
    # The model family's tool-call format (models/tool_parsers.py, vLLM's names); auto: read off the chat template.
    tool_call_parser: str = "auto"
    # vLLM's: a Jinja chat template file (or the template itself, one line) used instead of the model's own.
    chat_template: str | None = None
    # vLLM's: no access log line per request.
    disable_log_requests: bool = False
    # vLLM's flag, accepted: samebits runs no model code from a checkpoint, so it is never needed (serve says so).
    trust_remote_code: bool = False

    def __post_init__(self) -> None:
        names = self.served_model_name
        object.__setattr__(self, "served_model_name", (names,) if isinstance(names, str) else tuple(names or ()))
        self._check_names()
        self._check_engine()
        self._check_address()
        self._check_keys()
        self._check_limits()
        if self.tool_call_parser not in TOOL_CALL_PARSERS:
            raise FieldError("tool_call_parser", f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got "
                             f"{self.tool_call_parser!r}")

    def _check_engine(self) -> None:
        if not isinstance(self.engine, EngineConfig):
            raise FieldError("engine", f"engine must be an EngineConfig, got {type(self.engine).__name__}")
        if self.engine.max_waiting is None:
            raise FieldError("max_waiting",
                             "max_waiting must be set for a server (its waiting queue is bounded), got None")
        if self.engine_process is not None and not isinstance(self.engine_process, bool):
            raise FieldError("engine_process", f"engine_process must be None or a bool, got {self.engine_process!r}")

    def _check_names(self) -> None:
        if any(not isinstance(n, str) or not n for n in self.served_model_name):
            raise FieldError("served_model_name",
                             f"served_model_name must be non-empty strings, got {self.served_model_name!r}")
        for name in ("disable_log_requests", "trust_remote_code"):
            if not isinstance(getattr(self, name), bool):
                raise FieldError(name, f"{name} must be a bool, got {getattr(self, name)!r}")
        if self.chat_template is not None:
            self.chat_template_text()

    def chat_template_text(self) -> str | None:
        """--chat-template's template: the file's text, or the value itself when it is a template (as vLLM)."""
        value = self.chat_template
        if value is None:
            return None
        path = Path(value).expanduser()
        if path.is_file():
            return path.read_text(encoding="utf-8")
        if "{{" in value or "{%" in value:
            return value
        raise FieldError("chat_template", f"chat_template: no file at {value} (nor a Jinja template itself)")

    def uses_engine_process(self, device: str) -> bool:
        """engine_process, with None resolved for the engine's device ("cuda:0", "cpu", ...)."""
        if self.engine_process is not None:
            return self.engine_process
        return device.startswith("cuda") and self.engine.tensor_parallel_size == 1

    def _check_address(self) -> None:
        try:
            ipaddress.ip_address(self.host)
        except ValueError:
            if self.host != "localhost":
                raise FieldError("host", f"host must be an IP address or 'localhost', got {self.host!r}") from None
        if isinstance(self.port, bool) or not isinstance(self.port, int) or not 0 <= self.port <= 65535:
            raise FieldError("port", f"port must be in [0, 65535], got {self.port!r}")

    def _check_keys(self) -> None:
        if not isinstance(self.api_keys, tuple):
            raise FieldError("api_keys", "api_keys must be a tuple of strings")
        if any(not isinstance(k, str) or not k for k in self.api_keys):
            raise FieldError("api_keys", "api_keys must be non-empty strings")
        if self.api_key_file is not None:
            self._keys_in_file()

    def _keys_in_file(self) -> list[str]:
        path = self.api_key_file
        if not isinstance(path, str) or not path:
            raise FieldError("api_key_file", f"api_key_file must be None or a path, got {path!r}")
        try:
            lines = Path(path).expanduser().read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as e:
            raise FieldError("api_key_file",
                             f"api_key_file: cannot read {path}: {getattr(e, 'strerror', None) or e}") from None
        keys = [ln.strip() for ln in lines if ln.strip() and not ln.strip().startswith("#")]
        if not keys:
            raise FieldError("api_key_file", f"api_key_file: {path} holds no key (one a line)")
        return keys

    def resolved_api_keys(self) -> tuple[str, ...]:
        """Every accepted key: --api-key's, the key file's and SAMEBITS_API_KEY's, read when the server starts."""
        keys = list(self.api_keys)
        if self.api_key_file is not None:
            keys += self._keys_in_file()
        if os.environ.get(API_KEY_ENV):
            keys.append(os.environ[API_KEY_ENV])
        return tuple(dict.fromkeys(keys))

    def _check_limits(self) -> None:
        for name in ("max_n", "max_prompts", "max_stop", "max_body_bytes", "max_header_count", "max_header_bytes",
                     "max_waiting_tokens", "default_max_tokens", "timeout_keep_alive", "max_connections"):
            _positive(name, getattr(self, name))
        if self.max_prompt_chars is not None:
            _positive("max_prompt_chars", self.max_prompt_chars)
        for name in ("timeout_header", "timeout_body", "timeout_write"):
            _positive_seconds(name, getattr(self, name))
        if not isinstance(self.allow_special_tokens, bool):
            raise FieldError("allow_special_tokens",
                             f"allow_special_tokens must be a bool, got {self.allow_special_tokens!r}")
        if self.log_level not in LOG_LEVELS:
            raise FieldError("log_level", f"log_level must be one of {LOG_LEVELS}, got {self.log_level!r}")
        for name in ("max_logprobs", "max_engine_restarts"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise FieldError(name, f"{name} must be a non-negative integer, got {value!r}")

    @property
    def model_name(self) -> str:
        """The name responses report: the first served name, as vLLM's."""
        return self.served_names[0]

    @property
    def served_names(self) -> tuple[str, ...]:
        return self.served_model_name or (self.engine.model,)

    @classmethod
    def from_dict(cls, data: dict) -> ServerConfig:
        """Build from one flat mapping of server and engine fields (the serve flags, a config file); unknown keys
        are an error, not silently dropped."""
        server = {f.name for f in fields(cls)} - {"engine"}
        engine = {f.name for f in fields(EngineConfig)}
        unknown = sorted(set(data) - server - engine)
        if unknown:
            raise ValueError(f"unknown ServerConfig keys: {', '.join(unknown)}")
        values = {k: v for k, v in data.items() if k in server}
        if "api_keys" in values:
            values["api_keys"] = tuple(values["api_keys"])
        return cls(engine=SERVER_ENGINE.replace(**{k: v for k, v in data.items() if k in engine}), **values)
