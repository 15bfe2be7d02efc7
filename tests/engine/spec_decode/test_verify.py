"""The acceptance rule and vLLM's counts (the bits themselves: test_invariance.py)."""
import math

from samebits.engine.spec_decode.verify import SpecDecodeStats, accepted_prefix


def test_drafts_are_accepted_up_to_the_first_that_differs_from_its_draw():
    assert accepted_prefix([4, 5, 6], [4, 5, 6]) == 3
    assert accepted_prefix([4, 5, 6], [4, 9, 6]) == 1  # the third equal draw comes after a rejection: not kept
    assert accepted_prefix([4], [3]) == 0 and accepted_prefix([], []) == 0


def test_counts_as_vllm_reports_them():
    stats = SpecDecodeStats(4)
    assert math.isnan(stats.acceptance_rate) and stats.mean_acceptance_length == 1.0
    for drafted, accepted in [(4, 4), (4, 0), (2, 1), (3, 2)]:
        stats.observe(drafted, accepted)
    assert (stats.num_drafts, stats.num_draft_tokens, stats.num_accepted_tokens) == (4, 13, 7)
    assert stats.accepted_per_pos == [3, 2, 1, 1]
    assert stats.acceptance_rate == 7 / 13 and stats.mean_acceptance_length == 1 + 7 / 4
