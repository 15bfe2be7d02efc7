"""The engine's speculation: its drafter, which steps draft, and vLLM's counts. Torch-free.

Drafting is a bet that costs every step it is made: a verify step computes 1 + k rows a sequence and reads its draws
back before the next step is scheduled (a step launched ahead of its read-back cannot know where the sequence ends),
where a plain decode step computes one and overlaps the host with the device. So a verify step whose drafts keep
less than MIN_ACCEPTED tokens a chunk (or that found nothing to draft) doubles the run of plain steps before the next
try, up to MAX_BACKOFF; one that keeps more drafts again at once. Which steps draft never changes a bit of an output.
"""
from __future__ import annotations

from samebits.engine.sequence import Sequence
from samebits.engine.spec_decode.drafters import Drafter, decoding, draftable
from samebits.engine.spec_decode.verify import SpecDecodeStats

# A verify chunk of 1 + k rows costs little more than a decode row while a step's GEMMs are bound by reading their
# weights (small batches), but up to k + 1 times its compute where they are bound by it (large batches), and its
# read-back is not overlapped: a try that keeps less than half a token a chunk has cost more than it saved.
MIN_ACCEPTED = 0.5
# Plain steps between two tries at most: a try every 65 steps bounds what a drafter that is never right costs.
MAX_BACKOFF = 64


class Speculator:
    def __init__(self, drafter: Drafter, num_speculative_tokens: int):
        self.drafter = drafter
        self.stats = SpecDecodeStats(num_speculative_tokens)
        self.backoff = 0  # plain steps after the last failed try
        self.wait = 0  # plain steps still to run before the next try

    def due(self, running: list[Sequence]) -> bool:
        """Whether this step drafts; call once per step. A step with no draftable sequence neither drafts nor counts
        as one between tries (prefill steps, or constrained samples alone, would otherwise use up the back-off)."""
        if not any(draftable(s) for s in running):
            return False
        if self.wait:
            self.wait -= 1
            return False
        return True

    def propose(self, running: list[Sequence]) -> dict[int, list[int]]:
        return self.drafter.propose(decoding(running))

    def observe(self, verified: list[tuple[int, int]]) -> None:
        """A drafting step's (drafted, accepted) per verify chunk, from its read-back."""
        for drafted, accepted in verified:
            self.stats.observe(drafted, accepted)
        kept = sum(a for _, a in verified)
        if kept >= MIN_ACCEPTED * len(verified) and verified:
            self.backoff = 0
        else:
            self.backoff = min(MAX_BACKOFF, 2 * self.backoff or 1)
            self.wait = self.backoff
