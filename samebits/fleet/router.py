"""Which replica runs a request: least outstanding tokens, with prefix affinity. Torch-free, Ray-free.

Outstanding tokens are what a replica still holds for the requests routed to it: each counts n x (prompt +
max_tokens) from its routing until it ends, the same cost the engine's waiting limits count
(async_engine.waiting_cost). Prefix affinity sends requests that share their first blocks to the same replica, whose
prefix cache then holds them: the key is a hash of the prompt's first AFFINITY_BLOCKS full KV blocks, and the replica
is the key's rendezvous choice among the live ones (highest hash of key and replica), so a replica leaving or
joining moves only its own keys. Affinity yields to balance when the chosen replica holds more than
AFFINITY_SLACK_TOKENS above the least loaded one (SGLang's router balances its cache-aware choice the same way).
None of this changes a bit of any answer: every replica has the fleet's numerics identity.
"""
from __future__ import annotations

import hashlib
from collections.abc import Iterable
from dataclasses import dataclass

# Blocks of the prompt that name its prefix: a system prompt or a few-shot header is this long or longer; longer
# keys would split requests that share it by what follows.
AFFINITY_BLOCKS = 4
# How far above the least loaded replica the affine one may be before balance wins: about one long request.
AFFINITY_SLACK_TOKENS = 8192


def prefix_key(prompt_token_ids: list[int], block_size: int) -> bytes | None:
    """A hash of the prompt's first AFFINITY_BLOCKS full blocks (fewer if it has fewer); None without one."""
    full = min(len(prompt_token_ids) // block_size, AFFINITY_BLOCKS) * block_size
    if full == 0:
        return None
    data = b"".join(t.to_bytes(4, "little", signed=True) for t in prompt_token_ids[:full])
    return hashlib.blake2b(data, digest_size=16).digest()


def _rendezvous(key: bytes, replica: int) -> bytes:
    return hashlib.blake2b(key + replica.to_bytes(4, "little"), digest_size=8).digest()


@dataclass
class Load:
    """What the router knows of one replica."""

    up: bool = False
    outstanding_tokens: int = 0
    requests: int = 0
    routed: int = 0  # requests ever routed to it


class Router:
    def __init__(self, replicas: int, block_size: int):
        self.block_size = block_size
        self.loads = [Load() for _ in range(replicas)]

    def set_up(self, replica: int, up: bool) -> None:
        self.loads[replica].up = up

    @property
    def live(self) -> list[int]:
        return [i for i, load in enumerate(self.loads) if load.up]

    def pick(self, prompt_token_ids: list[int], exclude: Iterable[int] = ()) -> int | None:
        """The replica for a request with this prompt; None when no live replica is left."""
        skip = set(exclude)
        live = [i for i in self.live if i not in skip]
        if not live:
            return None
        least = min(live, key=lambda i: (self.loads[i].outstanding_tokens, i))
        key = prefix_key(prompt_token_ids, self.block_size)
        if key is None:
            return least
        affine = max(live, key=lambda i: _rendezvous(key, i))
        slack = self.loads[affine].outstanding_tokens - self.loads[least].outstanding_tokens
        return affine if slack <= AFFINITY_SLACK_TOKENS else least

    def started(self, replica: int, tokens: int) -> None:
        load = self.loads[replica]
        load.outstanding_tokens += tokens
        load.requests += 1
        load.routed += 1

    def ended(self, replica: int, tokens: int) -> None:
        load = self.loads[replica]
        load.outstanding_tokens -= tokens
        load.requests -= 1
