"""Per-request sampling parameters, validated once so the engine never sees a bad value."""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, fields
from functools import cached_property

from samebits.engine.seeds import check_seed
from samebits.errors import FieldError, require
from samebits.structured.params import StructuredOutputsParams

MAX_LOGPROBS = 20
# vLLM's and OpenAI's ranges: presence and frequency penalties in [-2, 2], a logit bias in [-100, 100].
PENALTY_LIMIT = 2.0
BIAS_LIMIT = 100.0

# vLLM SamplingParams names samebits does not implement, so passing one names the gap instead of "unknown".
NOT_IMPLEMENTED = ("bad_words", "logits_processors", "truncate_prompt_tokens",
                   "guided_decoding", "spaces_between_special_tokens",
                   "detokenize", "extra_args")


class RequestOutputKind(enum.IntEnum):
    """vLLM's: which outputs a request's steps return. CUMULATIVE, every step the whole output so far; FINAL_ONLY,
    the finished output alone (what the offline API needs, and it saves building the others)."""

    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


def _is_int(value) -> bool:
    # bool is an int subclass; True as max_tokens is a caller bug, not a count.
    return isinstance(value, int) and not isinstance(value, bool)


def _is_real(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = -1
    min_p: float = 0.0
    max_tokens: int = 16
    stop: str | list[str] | None = None
    stop_token_ids: list[int] | None = None
    ignore_eos: bool = False
    seed: int | None = None
    n: int = 1
    logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # The logits adjustments (sampler.adjust_logits), vLLM's semantics and order; the defaults change nothing.
    min_tokens: int = 0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    logit_bias: dict[int, float] | None = None
    allowed_token_ids: list[int] | None = None
    # The prompt tokens' logprobs and that many top alternatives, computed in the prefill (engine/prompt_logprobs.py),
    # bit-equal to what decoding reports for the same tokens; the request then skips the prefix cache.
    prompt_logprobs: int | None = None
    # The grammar the output follows (vLLM's shape; masked row by row before the draw, samebits/structured/).
    structured_outputs: StructuredOutputsParams | None = None
    output_kind: RequestOutputKind = RequestOutputKind.CUMULATIVE
    # vLLM's: draw best_of samples, return the n best. Every sample is returned, so only best_of == n (or None).
    best_of: int | None = None

    def __new__(cls, *args, **kwargs):
        # The dataclass __init__'s TypeError names neither the valid names nor whether vLLM has the unknown one.
        names = [f.name for f in fields(cls)]
        for key in kwargs:
            if key not in names:
                what = "is a vLLM field samebits does not implement" if key in NOT_IMPLEMENTED else "is unknown"
                raise TypeError(f"SamplingParams: {key!r} {what}; the valid names are {', '.join(names)}")
        return super().__new__(cls)

    def __post_init__(self) -> None:
        if self.top_k == 0 and _is_int(self.top_k):  # vLLM's and OpenAI's "off", held as our one spelling -1
            object.__setattr__(self, "top_k", -1)
        self._check_floats()
        self._check_counts()
        self._check_stops()
        self._check_adjustments()
        self._check_structured()
        kind = self.output_kind
        require(isinstance(kind, RequestOutputKind) and kind is not RequestOutputKind.DELTA, "output_kind",
                f"output_kind must be RequestOutputKind.CUMULATIVE or FINAL_ONLY (DELTA is not implemented), "
                f"got {kind!r}")
        for name in ("ignore_eos", "include_stop_str_in_output", "skip_special_tokens"):
            value = getattr(self, name)
            require(isinstance(value, bool), name, f"{name} must be a bool, got {value!r}")

    def _check_floats(self) -> None:
        t, p, m = self.temperature, self.top_p, self.min_p
        require(_is_real(t) and math.isfinite(t) and t >= 0, "temperature",
                f"temperature must be finite and >= 0, got {t!r}")
        require(_is_real(p) and 0 < p <= 1, "top_p", f"top_p must be in (0, 1], got {p!r}")
        require(_is_real(m) and 0 <= m <= 1, "min_p", f"min_p must be in [0, 1], got {m!r}")

    def _check_counts(self) -> None:
        k, mt, n, lp, s = self.top_k, self.max_tokens, self.n, self.logprobs, self.seed
        require(_is_int(k) and (k == -1 or k >= 1), "top_k", f"top_k must be -1 or 0 (off) or >= 1, got {k!r}")
        require(_is_int(mt) and mt >= 1, "max_tokens", f"max_tokens must be an int >= 1, got {mt!r}")
        require(_is_int(n) and n >= 1, "n", f"n must be an int >= 1, got {n!r}")
        require(self.best_of is None or self.best_of == n, "best_of",
                f"best_of must be None or equal n ({n}): samebits returns every sample it draws, got "
                f"{self.best_of!r}")
        lp_ok = lp is None or (_is_int(lp) and 0 <= lp <= MAX_LOGPROBS)
        require(lp_ok, "logprobs", f"logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {lp!r}")
        check_seed(s)

    def _check_stops(self) -> None:
        stop, ids = self.stop, self.stop_token_ids
        stop_ok = stop is None or isinstance(stop, str) or (
            isinstance(stop, (list, tuple)) and all(isinstance(s, str) for s in stop))
        require(stop_ok, "stop", f"stop must be None, a str or a list of str, got {stop!r}")
        require(not any(s == "" for s in self.stop_strings), "stop", "stop strings must be non-empty")
        ids_ok = ids is None or (isinstance(ids, (list, tuple)) and all(_is_int(i) and i >= 0 for i in ids))
        require(ids_ok, "stop_token_ids", f"stop_token_ids must be None or a list of ints >= 0, got {ids!r}")

    def _check_adjustments(self) -> None:
        mt, bias, allowed = self.min_tokens, self.logit_bias, self.allowed_token_ids
        require(_is_int(mt) and 0 <= mt <= self.max_tokens, "min_tokens",
                f"min_tokens must be an int in [0, max_tokens={self.max_tokens}], got {mt!r}")
        for name in ("presence_penalty", "frequency_penalty"):
            v = getattr(self, name)
            require(_is_real(v) and -PENALTY_LIMIT <= v <= PENALTY_LIMIT, name,
                    f"{name} must be in [-{PENALTY_LIMIT}, {PENALTY_LIMIT}], got {v!r}")
        r = self.repetition_penalty
        require(_is_real(r) and math.isfinite(r) and r > 0, "repetition_penalty",
                f"repetition_penalty must be finite and > 0, got {r!r}")
        bias_ok = bias is None or (isinstance(bias, dict) and all(
            _is_int(t) and t >= 0 and _is_real(b) and -BIAS_LIMIT <= b <= BIAS_LIMIT for t, b in bias.items()))
        require(bias_ok, "logit_bias",
                f"logit_bias must be None or a dict of token id >= 0 to a bias in [-{BIAS_LIMIT}, "
                f"{BIAS_LIMIT}], got {bias!r}")
        allowed_ok = allowed is None or (isinstance(allowed, (list, tuple)) and len(allowed) > 0 and all(
            _is_int(t) and t >= 0 for t in allowed))
        require(allowed_ok, "allowed_token_ids",
                f"allowed_token_ids must be None or a non-empty list of ints >= 0, got {allowed!r}")
        pl = self.prompt_logprobs
        require(pl is None or (_is_int(pl) and 0 <= pl <= MAX_LOGPROBS), "prompt_logprobs",
                f"prompt_logprobs must be None or an int in [0, {MAX_LOGPROBS}], got {pl!r}")

    def _check_structured(self) -> None:
        so = self.structured_outputs
        if so is None:
            return
        require(isinstance(so, StructuredOutputsParams), "structured_outputs",
                f"structured_outputs must be None or a StructuredOutputsParams, got {type(so).__name__}")
        # Either could leave a constrained row no allowed token with a finite logit (the grammar decides the tokens).
        require(self.allowed_token_ids is None, "allowed_token_ids",
                "allowed_token_ids cannot be combined with structured_outputs: the "
                "grammar decides which tokens are allowed")
        require(self.min_tokens == 0, "min_tokens",
                "min_tokens cannot be combined with structured_outputs: the grammar decides "
                "where the output may end")

    @cached_property
    def adjusts_logits(self) -> bool:
        """Whether any adjustment is on; the sampler runs none of their kernels for a batch where no row's is."""
        return bool(self.min_tokens or self.has_penalties or self.logit_bias or self.allowed_token_ids)

    @cached_property
    def has_penalties(self) -> bool:
        return self.presence_penalty != 0 or self.frequency_penalty != 0 or self.repetition_penalty != 1

    @cached_property  # read every step by the scheduler; cached_property works on frozen dataclasses
    def stop_strings(self) -> tuple[str, ...]:
        if self.stop is None:
            return ()
        return (self.stop,) if isinstance(self.stop, str) else tuple(self.stop)

    @cached_property
    def stop_token_set(self) -> frozenset[int]:
        return frozenset(self.stop_token_ids or ())


class ContextLengthError(FieldError):
    """The prompt, or the prompt and max_tokens together, do not fit the model's context; `field` names the field
    to blame ("prompt" or "max_tokens")."""


def check_prompt(prompt_token_ids: list[int], params: SamplingParams, vocab_size: int, max_model_len: int,
                 where: str = "prompt") -> None:
    """The engine's check of one prompt before it is queued: not empty, token ids in the vocabulary, the context."""
    n = len(prompt_token_ids)
    if n == 0:
        raise FieldError("prompt", "prompt must not be empty")
    bad = [t for t in prompt_token_ids if not isinstance(t, int) or not 0 <= t < vocab_size]
    if bad:
        raise FieldError("prompt", f"prompt token ids must be in [0, {vocab_size}); got {bad[0]!r}")
    check_context_length(n, params.max_tokens, max_model_len, where)


def check_context_length(prompt_len: int, max_tokens: int, max_model_len: int, where: str = "prompt") -> None:
    """The one context-length check: a prompt must leave room for at least one token, and prompt + max_tokens must
    fit max_model_len. `where` names the prompt in the message ("prompt", "messages")."""
    limit = max_model_len
    if prompt_len >= limit:
        raise ContextLengthError("prompt",
            f"This model's maximum context length is {limit} tokens. However, your {where} has {prompt_len} tokens. "
            f"Please reduce the length of the {where}.")
    if prompt_len + max_tokens > limit:
        raise ContextLengthError("max_tokens",
            f"This model's maximum context length is {limit} tokens. However, you requested "
            f"{prompt_len + max_tokens} tokens ({prompt_len} in the {where}, {max_tokens} in the completion). "
            f"Please reduce the length of the {where} or completion.")


def check_vocab(params: SamplingParams, vocab_size: int) -> None:
    """The token ids a SamplingParams names for the sampler (logit_bias's keys, allowed_token_ids) must be in the
    model's vocabulary, which SamplingParams cannot know; the sampler indexes logits with them."""
    for name, ids in (("logit_bias", params.logit_bias or ()), ("allowed_token_ids", params.allowed_token_ids or ())):
        bad = [t for t in ids if t >= vocab_size]
        require(not bad, name, f"{name}: token id {bad[0] if bad else 0} is outside the vocabulary [0, {vocab_size})")
