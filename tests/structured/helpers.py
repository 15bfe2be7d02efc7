"""The negative control of every structured-output invariance test: a grammar mask shared by the batch."""
from __future__ import annotations

from samebits.structured.masks import GrammarRows


def share_masks_across_the_batch(monkeypatch) -> None:
    """Every grammar row of a batch gets the union of the batch's masks (a batch-dependent mask, the bug)."""
    row_local = GrammarRows.host_words

    def union(self, vocab, pin):
        words = row_local(self, vocab, pin)
        shared = words[0].clone()
        for row in words[1:]:
            shared |= row
        return shared.expand_as(words).clone()

    monkeypatch.setattr(GrammarRows, "host_words", union)
