"""`SpeculativeConfig`: vLLM's `speculative_config` keys, validated once; `EngineConfig.speculative_config` holds one.

Torch-free (the engine config, the CLI and the scheduler read it). Every error names its field as
`speculative_config.<key>` and the limit, so `LLM(..., speculative_config={...})` and `samebits serve
--speculative-config JSON` fail at load with the same words.
"""
from __future__ import annotations

import dataclasses
import json
from dataclasses import dataclass

# "ngram": prompt lookup, the longest suffix n-gram's earlier continuation (ngram.py); "draft_model": a smaller
# model's greedy tokens (draft_model.py). vLLM's names.
METHODS = ("ngram", "draft_model")
# Acceptance compounds per position: at 0.8 a token, the 17th draft token is reached in 2 % of the steps, so a longer
# draft only adds verify rows that are almost never used.
MAX_SPECULATIVE_TOKENS = 16
# vLLM's default n-gram window when neither bound is given (its SpeculativeConfig.__post_init__).
DEFAULT_PROMPT_LOOKUP = 5
FIELD = "speculative_config"


def _check(ok: bool, key: str, message: str) -> None:
    if not ok:
        raise ValueError(f"{FIELD}.{key} {message}")


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


@dataclass(frozen=True)
class SpeculativeConfig:
    method: str
    num_speculative_tokens: int
    prompt_lookup_min: int | None = None
    prompt_lookup_max: int | None = None
    model: str | None = None  # the draft model (a name or path, as EngineConfig.model), for method "draft_model"

    def __post_init__(self) -> None:
        _check(self.method in METHODS, "method", f"must be one of {METHODS}, got {self.method!r}")
        k = self.num_speculative_tokens
        _check(_is_int(k) and 1 <= k <= MAX_SPECULATIVE_TOKENS, "num_speculative_tokens",
               f"must be an int in [1, {MAX_SPECULATIVE_TOKENS}], got {k!r}")
        if self.method == "ngram":
            self._check_ngram()
        else:
            self._check_draft_model()

    def _check_ngram(self) -> None:
        _check(self.model is None, "model", f"is for method 'draft_model'; method 'ngram' takes none, got "
                                            f"{self.model!r}")
        low, high = self.prompt_lookup_min, self.prompt_lookup_max
        low, high = (DEFAULT_PROMPT_LOOKUP, DEFAULT_PROMPT_LOOKUP) if low is None and high is None else (
            high if low is None else low, low if high is None else high)
        for key, value in (("prompt_lookup_min", low), ("prompt_lookup_max", high)):
            _check(_is_int(value) and value >= 1, key, f"must be an int >= 1, got {value!r}")
        _check(low <= high, "prompt_lookup_min", f"must be <= prompt_lookup_max={high}, got {low}")
        object.__setattr__(self, "prompt_lookup_min", low)
        object.__setattr__(self, "prompt_lookup_max", high)

    def _check_draft_model(self) -> None:
        _check(isinstance(self.model, str) and self.model != "", "model",
               f"must name the draft model (a name or path) for method 'draft_model', got {self.model!r}")
        for key in ("prompt_lookup_min", "prompt_lookup_max"):
            value = getattr(self, key)
            _check(value is None, key, f"is for method 'ngram'; method 'draft_model' takes none, got {value!r}")

    @classmethod
    def parse(cls, value) -> SpeculativeConfig | None:
        """None, a SpeculativeConfig, a dict of its keys or that dict as JSON (the CLI flag's form); unknown keys are
        refused by name."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            try:
                value = json.loads(value)
            except json.JSONDecodeError as e:
                raise ValueError(f"{FIELD} must be a JSON object of its keys, got {value!r} ({e})") from None
        if not isinstance(value, dict):
            raise ValueError(f"{FIELD} must be None or a dict of its keys, got {value!r}")  # noqa: TRY004
        known = [f.name for f in dataclasses.fields(cls)]
        unknown = sorted(set(value) - set(known))
        if unknown:
            raise ValueError(f"{FIELD}: unknown keys {unknown}; valid keys are {known}")
        for key in ("method", "num_speculative_tokens"):
            _check(key in value, key, "is required")
        return cls(**value)
