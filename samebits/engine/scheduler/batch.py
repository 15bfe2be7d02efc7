"""What the scheduler hands the runner each step: the chunks to run, and the padding a fixed-shape policy adds."""
from __future__ import annotations

from dataclasses import dataclass, field

from samebits.engine.sequence import Sequence


@dataclass(slots=True)  # slots: built and read per sequence per step
class ScheduledSeq:
    seq: Sequence
    num_new_tokens: int
    # True when this chunk ends at the sequence's last token, so its last row's logits give the next token.
    sample: bool
    # seq.num_computed_tokens at schedule time: new token i sits at position start + i.
    start: int
    # Positions whose rows' logits give prompt logprobs (Sequence.prompt_rows), within [start, context_len).
    prompt_rows: range = range(0)
    # Draft tokens this decode chunk verifies (engine/spec_decode/): its last 1 + len(drafts) rows are sampled, the
    # drafts being its last len(drafts) input tokens.
    drafts: tuple[int, ...] = ()

    @property
    def token_ids(self) -> list[int]:
        return self.seq.token_ids[self.start:self.start + self.num_new_tokens]

    @property
    def context_len(self) -> int:
        return self.start + self.num_new_tokens

    @property
    def is_decode(self) -> bool:
        return self.num_new_tokens == 1 and self.sample


@dataclass
class SchedulerOutput:
    scheduled: list[ScheduledSeq] = field(default_factory=list)
    preempted: list[Sequence] = field(default_factory=list)
    kind: str = "empty"  # "empty" | "prefill" | "decode" | "mixed"
    # Token counts of dummy sequences the runner appends after the real ones (the bucketed policy's fixed shapes).
    padding: tuple[int, ...] = ()
    num_running: int = 0
    num_waiting: int = 0

    @property
    def num_batched_tokens(self) -> int:
        return sum(s.num_new_tokens for s in self.scheduled)

    @property
    def num_padded_tokens(self) -> int:
        """Total rows of the step's flattened token batch, padding included."""
        return self.num_batched_tokens + sum(self.padding)
