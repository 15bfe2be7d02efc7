"""The router: least outstanding tokens, prefix affinity that yields to balance, only live replicas."""
from samebits.fleet.router import AFFINITY_BLOCKS, AFFINITY_SLACK_TOKENS, Router, prefix_key


def router(n: int = 3) -> Router:
    r = Router(n, block_size=4)
    for i in range(n):
        r.set_up(i, True)
    return r


def test_short_prompts_go_to_the_least_loaded_live_replica():
    r = router()
    r.started(0, 100)
    r.started(1, 50)
    assert r.pick([1, 2]) == 2
    r.set_up(2, False)
    assert r.pick([1, 2]) == 1
    r.ended(0, 100)
    assert r.pick([1, 2]) == 0
    assert r.pick([1, 2], exclude=[0, 1]) is None


def test_a_shared_prefix_sticks_to_one_replica_until_it_is_too_far_ahead():
    r = router()
    head = list(range(4 * AFFINITY_BLOCKS))
    first = r.pick(head + [7])
    assert all(r.pick(head + [k, k]) == first for k in range(20))  # the key reads the first blocks only
    r.started(first, AFFINITY_SLACK_TOKENS + 1)
    assert r.pick(head + [7]) != first  # balance wins
    assert prefix_key(head, 4) == prefix_key(head + [1, 2, 3, 4], 4) != prefix_key([9] + head[1:], 4)


def test_a_replica_leaving_moves_only_its_own_prefixes():
    r = router(4)
    keys = [[k] * 16 for k in range(64)]
    before = [r.pick(k) for k in keys]
    r.set_up(3, False)
    after = [r.pick(k) for k in keys]
    assert all(a == b for a, b in zip(after, before) if b != 3)
    assert len(set(before)) == 4  # the control: keys were spread over every replica
