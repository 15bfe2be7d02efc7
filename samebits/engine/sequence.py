"""One Sequence per sample: a request with n > 1 becomes n sequences sharing the prompt."""
from __future__ import annotations

import enum
import itertools
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from samebits.engine.sampling_params import SamplingParams

_seq_ids = itertools.count()

# The id a token slot holds from the step that samples it until its draw is read back (`Sequence.reserve_token`). Never
# a vocabulary id, so a step that read it instead of the device's draw would fail loudly in the embedding.
PENDING = -1


class SequenceStatus(enum.Enum):
    WAITING = "waiting"
    RUNNING = "running"
    FINISHED_STOPPED = "finished_stopped"
    FINISHED_LENGTH = "finished_length"
    FINISHED_ABORTED = "finished_aborted"


_WAITING, _RUNNING = SequenceStatus.WAITING, SequenceStatus.RUNNING
FINISH_STATUS = {
    "stop": SequenceStatus.FINISHED_STOPPED,
    "length": SequenceStatus.FINISHED_LENGTH,
    "abort": SequenceStatus.FINISHED_ABORTED,
}


@dataclass(eq=False)
class PromptRows:
    """A request's prompt-logprob rows (SamplingParams.prompt_logprobs), shared by its samples: row p's logits give
    prompt token p + 1's logprob. `scheduled` counts the leading rows some sample's chunk has computed, so each row
    reaches the output once, across samples and recomputes after a preemption."""

    wanted: int  # num_prompt_tokens - 1: nothing predicts the first token
    scheduled: int = 0

    def take(self, start: int, end: int) -> range:
        """The rows a chunk over positions [start, end) computes for the output (none already taken)."""
        rows = range(max(start, self.scheduled), min(end, self.wanted))
        if rows:
            self.scheduled = rows.stop
        return rows


class Finish(NamedTuple):
    """The output processor's decision that seq ends now; the scheduler applies it."""

    seq: Sequence
    reason: str  # a FINISH_STATUS key
    stop_reason: str | int | None = None  # the stop string or stop token id, None for eos, length and abort


@dataclass(eq=False)  # identity semantics: two samples with equal tokens are still two sequences
class Sequence:
    request_id: str
    token_ids: list[int]
    params: SamplingParams = field(default_factory=SamplingParams)
    seed: int | None = None
    sample_index: int = 0
    arrival: int = 0
    seq_id: int = field(default_factory=lambda: next(_seq_ids))
    num_prompt_tokens: int = -1
    status: SequenceStatus = SequenceStatus.WAITING
    num_computed_tokens: int = 0
    num_cached_tokens: int = 0
    num_preemptions: int = 0
    block_table: list[int] = field(default_factory=list)
    # Chained hashes of this sequence's full blocks, filled lazily by the block manager; tokens only grow,
    # so a full block's hash never changes.
    block_hashes: list[bytes] = field(default_factory=list)
    finish_reason: str | None = None
    stop_reason: str | int | None = None
    # Trailing token slots whose draw is still on the device (0; 1 between a step and its read-back; 2 while a step
    # is scheduled ahead of the read-back, engine/llm_engine.py). The resolved tokens are those before them.
    num_pending: int = 0
    # time.monotonic() when the scheduler first admitted it (for queue and prefill time metrics; never numerics).
    first_scheduled: float | None = None
    # Set when the request asks for prompt logprobs; the same object for all its samples.
    prompt_rows: PromptRows | None = None
    # The sample's grammar matcher when its request asks for structured outputs (structured/grammar.py; the engine
    # sets it, the output processor advances it, the sampler masks with it).
    grammar: Any = None

    def __post_init__(self) -> None:
        self.token_ids = list(self.token_ids)
        if self.num_prompt_tokens < 0:
            self.num_prompt_tokens = len(self.token_ids)
        if self.num_prompt_tokens < 1:
            raise ValueError("prompt_token_ids must hold at least 1 token")

    @property
    def num_tokens(self) -> int:
        return len(self.token_ids)

    @property
    def num_resolved(self) -> int:
        """Tokens whose ids are known on the host."""
        return len(self.token_ids) - self.num_pending

    @property
    def num_generated(self) -> int:
        return self.num_resolved - self.num_prompt_tokens

    @property
    def num_uncomputed(self) -> int:
        return len(self.token_ids) - self.num_computed_tokens

    @property
    def prompt_token_ids(self) -> list[int]:
        return self.token_ids[: self.num_prompt_tokens]

    @property
    def output_token_ids(self) -> list[int]:
        return self.token_ids[self.num_prompt_tokens : self.num_resolved]

    @property
    def last_token_id(self) -> int:
        return self.token_ids[self.num_resolved - 1]

    @property
    def is_finished(self) -> bool:
        status = self.status  # identity, not a set lookup: checked per sequence per step
        return status is not _WAITING and status is not _RUNNING

    @property
    def wants_prompt_rows(self) -> bool:
        """Prompt-logprob rows are still to be computed: the prefix cache would skip them (block_manager.py)."""
        rows = self.prompt_rows
        return rows is not None and rows.scheduled < rows.wanted

    @property
    def in_prefill(self) -> bool:
        # More than one token left means at least part of a (re)computed prompt is still ahead.
        return self.num_uncomputed > 1

    def reserve_token(self) -> None:
        """The scheduled chunk samples this sequence's next token: hold its slot until the draw is read back."""
        self.token_ids.append(PENDING)
        self.num_pending += 1

    def resolve_token(self, token_id: int) -> None:
        """The oldest pending draw has been read back."""
        if not self.num_pending:
            raise RuntimeError(f"{self!r} has no pending token to resolve")
        self.token_ids[self.num_resolved] = token_id
        self.num_pending -= 1

    def drop_pending(self) -> None:
        """Finished: a draw scheduled ahead of the finish is never read back."""
        del self.token_ids[self.num_resolved:]
        self.num_pending = 0

    def __repr__(self) -> str:
        return (f"Sequence(id={self.seq_id}, req={self.request_id!r}#{self.sample_index}, {self.status.value}, "
                f"tokens={self.num_tokens}, pending={self.num_pending}, computed={self.num_computed_tokens}, blocks={len(self.block_table)})")


def ends_by_length(seq: Sequence, num_tokens: int, max_model_len: int) -> bool:
    """Whether seq, once it holds num_tokens tokens, has reached max_tokens or max_model_len."""
    return num_tokens - seq.num_prompt_tokens >= seq.params.max_tokens or num_tokens >= max_model_len


def make_sequences(request_id: str, prompt_token_ids: list[int], params: SamplingParams, seed: int | None,
                   arrival: int = 0) -> list[Sequence]:
    """The n samples of one request; arrival i+k keeps FCFS order among siblings."""
    rows = PromptRows(len(prompt_token_ids) - 1) if params.prompt_logprobs is not None else None
    return [Sequence(request_id, list(prompt_token_ids), params, seed, sample_index=k, arrival=arrival + k,
                     prompt_rows=rows) for k in range(params.n)]
