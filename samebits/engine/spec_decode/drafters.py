"""The drafter a SpeculativeConfig names, and which sequences it drafts for."""
from __future__ import annotations

from typing import Protocol

from samebits.engine.sequence import Sequence


class Drafter(Protocol):
    def propose(self, seqs: list[Sequence]) -> dict[int, list[int]]:
        """seq_id -> up to k tokens proposed to follow that sequence's last one; sequences missing from `seqs` are
        forgotten (finished, preempted, or back in prefill)."""


def make_drafter(config, target, num_tokens: int, max_model_len: int) -> Drafter:
    """`config`: the engine's (on its device); `target`: its LoadedModel; `num_tokens`: its KV pool's tokens."""
    spec = config.speculative_config
    if spec.method == "ngram":
        from samebits.engine.spec_decode.ngram import NgramDrafter

        return NgramDrafter(spec.num_speculative_tokens, spec.prompt_lookup_min, spec.prompt_lookup_max)
    from samebits.engine.spec_decode.draft_model import DraftModelDrafter, load_draft

    draft = load_draft(spec.model, config.mode, target)
    return DraftModelDrafter(spec.num_speculative_tokens, draft, config, num_tokens, max_model_len)


def draftable(seq: Sequence) -> bool:
    """Whether drafts may follow seq once its tokens are read back: a decoding sequence without a grammar. A
    constrained sample is never drafted for: its verify row i would need the mask of its grammar advanced over
    d1..di and rolled back over the rejected ones (structured/grammar.py advances a matcher only over read-back
    tokens). It decodes one row a step, in its neighbours' verify steps, with plain decoding's bits."""
    return seq.num_uncomputed == 1 and seq.grammar is None


def decoding(running: list[Sequence]) -> list[Sequence]:
    """The running sequences a draft can follow now: draftable, none of their tokens pending."""
    return [s for s in running if draftable(s) and not s.num_pending]
