"""Speculative decoding whose every output is plain decoding's bits (docs/SPECULATIVE.md).

A drafter proposes up to k tokens per decoding sequence (`ngram.py`, `draft_model.py`); the scheduler appends them to
the sequence's decode chunk, whose 1 + k rows the target computes in one forward; the sampler draws every row exactly
as plain decoding draws that position; `verify.py` accepts the drafts up to the first that differs from the draw.
"""
