"""The ordered route against the number of tokens in the step, at 4 ranks (at 2, any order is one: a+b = b+a):
gloo's own all-reduce cuts the message into chunks by its size, so an element's order follows how many rows share
it (the negative control); all-gather + the fixed tree does not."""
import pytest

from samebits.distributed.group import run_ranks
from samebits.distributed.reduce import differences_with_tokens

pytestmark = pytest.mark.timeout(120)
SEED = 20261201  # fixed: the partials are rank r's N(0,1) from SEED + r, scaled over 8 decades


@pytest.fixture(scope="module")
def differing():
    return run_ranks(differences_with_tokens, 4, (SEED,), timeout_s=90, join_s=10)


def test_ordered_route_bits_do_not_follow_the_token_count(differing):
    assert differing["ordered"] == 0


def test_negative_control_gloo_all_reduce_bits_follow_the_token_count(differing):
    assert differing["native"] > 0, "gloo's all-reduce gave the same bits at every message size"
