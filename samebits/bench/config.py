"""`BenchConfig`: every knob of `samebits bench`, one flag each, validated once. Errors name the flag and its limit."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from samebits.bench.shapes import SHAPES
from samebits.dtypes import check_quantization
from samebits.engine.seeds import SEED_LIMIT
from samebits.modes import MODES

BENCH_MODES = (*MODES, "both")
MAX_REQUESTS = 65536  # past this, the prompts alone are gigabytes of Python lists
MAX_TOKENS = 1 << 20  # per request and range end; the model's own context is checked once it is loaded (run.py)
MAX_NUM_BATCHED_TOKENS = 8192  # the default token budget of a step


def _flag(name: str) -> str:
    return "--" + name.replace("_", "-")


def _int_in(name: str, value, low: int, high: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or not low <= value <= high:
        raise ValueError(f"{_flag(name)} must be an int in [{low}, {high}], got {value!r}")


def _range(name: str, value) -> None:
    """(min, max) token counts, 1 <= min <= max."""
    if not isinstance(value, tuple) or len(value) != 2:
        raise ValueError(f"{_flag(name)} takes two numbers, MIN MAX, got {value!r}")
    lo, hi = value
    _int_in(f"{name} MIN", lo, 1, MAX_TOKENS)
    _int_in(f"{name} MAX", hi, lo, MAX_TOKENS)


@dataclass(frozen=True)
class BenchConfig:
    model: str | None = None  # None: the built-in default (models/hub.py), unless random_shape is given
    random_shape: str | None = None
    mode: str = "both"
    requests: int = 256
    prompt_tokens: tuple[int, int] = (128, 1024)
    output_tokens: tuple[int, int] = (128, 512)
    rerun_alone: int = 8
    device: str | None = None
    seed: int = 0
    max_num_batched_tokens: int = MAX_NUM_BATCHED_TOKENS
    # One untimed pass of the whole workload first, the prefix cache emptied after it: compiled kernels and captured
    # graphs are then those of a server that has run a while (a cold pass pays Triton's compiles in its steps).
    warm: bool = False
    quantization: str | None = None  # serve's --quantization (docs/FP8.md): the model's linears in FP8

    def __post_init__(self) -> None:
        if self.model is not None and self.random_shape is not None:
            raise ValueError(f"--model {self.model} and --random-shape {self.random_shape} both given; give one")
        if self.random_shape is not None and self.random_shape not in SHAPES:
            raise ValueError(f"--random-shape must be one of {', '.join(sorted(SHAPES))}, got {self.random_shape!r}")
        if self.mode not in BENCH_MODES:
            raise ValueError(f"--mode must be one of {', '.join(BENCH_MODES)}, got {self.mode!r}")
        _int_in("requests", self.requests, 1, MAX_REQUESTS)
        _range("prompt_tokens", self.prompt_tokens)
        _range("output_tokens", self.output_tokens)
        _int_in("rerun_alone", self.rerun_alone, 0, self.requests)
        _int_in("seed", self.seed, 0, SEED_LIMIT - 1)
        _int_in("max_num_batched_tokens", self.max_num_batched_tokens, 1, MAX_TOKENS)
        try:
            check_quantization(self.quantization)
        except ValueError as e:
            raise ValueError(f"--{e}") from None
        if not isinstance(self.warm, bool):
            raise ValueError(f"--warm is a switch, got {self.warm!r}")  # noqa: TRY004 - the CLI reports ValueErrors

    @property
    def modes(self) -> tuple[str, ...]:
        """Deterministic first: it enters the deployment template before anything touches the device."""
        return ("deterministic", "fast") if self.mode == "both" else (self.mode,)

    @classmethod
    def from_dict(cls, values: dict) -> BenchConfig:
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(values) - known)
        if unknown:
            raise ValueError(f"unknown BenchConfig keys {unknown}; valid keys are {sorted(known)}")
        return cls(**values)
