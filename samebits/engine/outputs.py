"""What the engine hands back: one RequestOutput per request, one CompletionOutput per sample."""
from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, NamedTuple


@dataclass
class StepResult:
    """What one step drew for one sequence, read back to the host."""

    token_id: int
    logprob: float
    top_logprobs: dict[int, float]
    rank: int | None = None  # the token's rank (sampler.token_ranks) when its request asks for logprobs


@dataclass
class PromptStepResult:
    """One step's prompt-logprob rows of one request, read back: row i scores prompt token first + i + 1."""

    first: int
    logprobs: list[float]
    ranks: list[int]
    top_logprobs: list[dict[int, float]]


@dataclass(frozen=True)
class Logprob:
    """vLLM's per-token logprob record. rank: a sampled or prompt token's is vLLM's count, how many tokens of its row
    are at least as likely (engine/sampler.py token_ranks); a top-k alternative's is its place among them."""

    logprob: float
    rank: int | None = None
    decoded_token: str | None = None


class SampleLogprobs(Sequence):
    """vLLM's `list[dict[int, Logprob]]` view of a sample's logprobs, built per step on access (a cumulative output
    costs nothing per step until read): step i holds the sampled token, with its rank, and the top-k alternatives."""

    def __init__(self, token_ids: list[int], token_logprobs: list[float], top: list[dict[int, float]] | None,
                 decode: Callable[[list[int]], str] | None = None, ranks: Sequence[int | None] | None = None):
        self._ids, self._lps, self._top, self._decode = token_ids, token_logprobs, top, decode
        self._ranks = ranks

    def __len__(self) -> int:
        return len(self._lps)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        return self._step(i, None if self._ranks is None else self._ranks[i])

    def _step(self, i: int, rank: int | None) -> dict[int, Logprob]:
        token = self._ids[i]
        step = {token: Logprob(self._lps[i], rank, self._text(token))}
        for r, (t, lp) in enumerate((self._top[i] if self._top else {}).items(), 1):
            step[t] = Logprob(lp, r, self._text(t))
        return step

    def _text(self, token: int) -> str | None:
        return None if self._decode is None else self._decode([token])

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and list(self) == list(other)

    def __repr__(self) -> str:
        return f"SampleLogprobs({list(self)!r})"


class PromptLogprobs(SampleLogprobs):
    """vLLM's `prompt_logprobs`: None for the first prompt token (nothing predicts it), then per prompt token
    {token_id: Logprob} with the token's rank (how many tokens are at least as likely: vLLM's count) and the top-k
    alternatives. `decode` fills decoded_token (the offline API sets the tokenizer's)."""

    def __init__(self, prompt_token_ids: list[int], token_logprobs: list[float], ranks: list[int],
                 top: list[dict[int, float]] | None, decode: Callable[[list[int]], str] | None = None):
        super().__init__(prompt_token_ids[1:], token_logprobs, top, decode, ranks)

    @property
    def decode(self) -> Callable[[list[int]], str] | None:
        return self._decode

    @decode.setter
    def decode(self, fn: Callable[[list[int]], str] | None) -> None:
        self._decode = fn

    def __len__(self) -> int:
        return 1 + len(self._lps)

    def __getitem__(self, i):
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        i = i + len(self) if i < 0 else i
        if not 0 <= i < len(self):
            raise IndexError(f"prompt position {i} out of range for {len(self)} prompt tokens")
        return None if i == 0 else super().__getitem__(i - 1)

    def __repr__(self) -> str:
        return f"PromptLogprobs({list(self)!r})"


class ListView(Sequence):
    """items[start:stop] of a list that only changes past `stop` (appended to, or rewritten there): what it reads
    never changes, so a running request's outputs share the engine's lists instead of copying them every step."""

    __slots__ = ("_items", "_n", "_start")

    def __init__(self, items: list, start: int, stop: int) -> None:
        self._items, self._start, self._n = items, start, stop - start

    def __len__(self) -> int:
        return self._n

    def __getitem__(self, i):
        if isinstance(i, slice):
            start, stop, step = i.indices(self._n)
            if step > 0:
                return self._items[self._start + start:self._start + stop:step]
            return list(self)[i]
        if not -self._n <= i < self._n:
            raise IndexError(f"index {i} out of range for {self._n} items")
        return self._items[self._start + i % self._n]

    def __iter__(self):
        return iter(self._items[self._start:self._start + self._n])

    def __eq__(self, other) -> bool:
        return isinstance(other, Sequence) and len(other) == self._n and list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


@dataclass
class CompletionOutput:
    index: int
    text: str
    # The sequences below are lists in a request's finished output and read-only ListViews while it runs.
    token_ids: Sequence[int]
    # Sampled token's logprob per step; python floats that are exactly float32 values, so bits survive JSON.
    # (`logprobs` holds the same values in vLLM's shape.)
    token_logprobs: Sequence[float] | None = None
    # Per step: {token_id: logprob} for the top-k alternatives when SamplingParams.logprobs > 0, best first.
    top_logprobs: Sequence[dict[int, float]] | None = None
    cumulative_logprob: float | None = None
    # "stop" | "length" | "abort" | None while running.
    finish_reason: str | None = None
    # The stop string or stop token id that ended the sample (None for eos, length or running).
    stop_reason: str | int | None = None
    # Per step the sampled token's rank (vLLM's count, engine/sampler.py token_ranks) when logprobs are asked for.
    token_ranks: Sequence[int] | None = None

    # Decodes one token for Logprob.decoded_token; the offline API (LLM) sets the tokenizer's.
    decode: Callable[[list[int]], str] | None = field(default=None, repr=False, compare=False)

    def finished(self) -> bool:
        return self.finish_reason is not None

    @property
    def logprobs(self) -> SampleLogprobs | None:
        """vLLM's shape: `logprobs[i][token_id].logprob`, the sampled token's and the top-k alternatives' per step."""
        if self.token_logprobs is None:
            return None
        return SampleLogprobs(self.token_ids, self.token_logprobs, self.top_logprobs, self.decode, self.token_ranks)


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
    # vLLM's prompt_logprobs (SamplingParams.prompt_logprobs): None for the first prompt token, then {token_id: Logprob};
    # set once every prompt row is read back, which is before the first sampled token is.
    prompt_logprobs: PromptLogprobs | None = None
    # time.monotonic() when the first of its samples was scheduled; None before that (vLLM's first_scheduled_time).
    first_scheduled_time: float | None = None


@dataclass(frozen=True)
class Resume:
    """A request's samples as one engine sent them before it was lost, to be continued on another
    (LLMEngine.add_request's `resume`): each sample's tokens so far, their logprobs, cumulative logprob and text, and
    how it finished if it did. Plain lists: it crosses processes."""

    seed: int
    samples: tuple[CompletionOutput, ...]

    @classmethod
    def of(cls, out: RequestOutput) -> Resume:
        def copy(c: CompletionOutput) -> CompletionOutput:
            def listed(xs):
                return None if xs is None else list(xs)

            return CompletionOutput(c.index, c.text, list(c.token_ids), listed(c.token_logprobs),
                                    listed(c.top_logprobs), c.cumulative_logprob, c.finish_reason, c.stop_reason,
                                    listed(c.token_ranks))

        return cls(out.seed, tuple(copy(c) for c in out.outputs))

    def check(self, params, seed: int) -> None:
        """ValueError unless this continues a request with these params and seed (the draws are keyed by it)."""
        if seed != self.seed or len(self.samples) != params.n:
            raise ValueError(f"resume: the sent output has seed {self.seed} and {len(self.samples)} samples, the "
                             f"request seed {seed} and n={params.n}")
        if all(c.finish_reason is not None for c in self.samples):
            raise ValueError("resume: every sample has finished; nothing is left to continue")


class StepProgress(NamedTuple):
    """How far one step advanced one request, whether or not its output was due (a FINAL_ONLY request's is not until
    it finishes): what the server counts tokens and latencies by. Picklable, a few scalars."""

    request_id: str
    new_tokens: int  # tokens its samples took in this step
    first_scheduled_time: float | None  # as RequestOutput's


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
    # Speculative decoding's counts (engine/spec_decode/verify.py SpecDecodeStats), vLLM's; the per-position tuple
    # holds num_speculative_tokens entries when speculation is on and is empty when it is off.
    spec_num_drafts: int = 0
    spec_num_draft_tokens: int = 0
    spec_num_accepted_tokens: int = 0
    spec_accepted_per_pos: tuple[int, ...] = ()


@dataclass(frozen=True)
class EngineInfo:
    """What the server says about the engine it serves (the startup line, the admin route's dtype); picklable."""

    model_name: str
    model_path: str
    mode: str
    vocab_size: int
    max_model_len: int
    dtype: Any  # the runner's torch.dtype
    device: str
    num_blocks: int
    block_size: int
