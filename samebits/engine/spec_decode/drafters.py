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


def decoding(running: list[Sequence]) -> list[Sequence]:
    """The running sequences whose next chunk is a decode (every token but the last computed, none pending): the
    ones a draft can follow."""
    return [s for s in running if s.num_uncomputed == 1 and not s.num_pending]
