"""Paged KV blocks with prefix caching: hash-chained full blocks, ref counts, LRU eviction of free cached blocks.

Torch-free: it only hands out block ids; the model runner owns the tensors they index.
A block is *cached* when it holds the KV of a full, computed block of tokens and its chained hash is registered;
a cached block whose ref count drops to 0 stays findable until the allocator needs it (LRU eviction).
"""
from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from samebits.arith import cdiv
from samebits.engine.sequence import Sequence

ROOT_HASH = b"samebits-kv-root"


def hash_block(parent: bytes, tokens) -> bytes:
    """Stable across processes (unlike hash()), and chained so equal blocks after different prefixes differ."""
    h = hashlib.blake2b(parent, digest_size=16)
    h.update(b"".join(int(t).to_bytes(8, "little", signed=True) for t in tokens))
    return h.digest()


class IntegrityError(AssertionError):
    pass


def require(ok: bool, message: str) -> None:
    # Explicit raise rather than assert: integrity checks must survive python -O.
    if not ok:
        raise IntegrityError(message)


@dataclass
class Block:
    block_id: int
    ref_count: int = 0
    hash: bytes | None = None


@dataclass
class PrefixStats:
    queries: int = 0  # prompt tokens looked up at admission
    hits: int = 0  # of which found in the cache
    evictions: int = 0  # cached blocks reused for other tokens


class BlockManager:
    def __init__(self, num_blocks: int, block_size: int, enable_prefix_caching: bool = True):
        if num_blocks < 1 or block_size < 1:
            raise ValueError(f"num_blocks and block_size must be >= 1, got {num_blocks}, {block_size}")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self.enable_prefix_caching = enable_prefix_caching
        self.blocks = [Block(i) for i in range(num_blocks)]
        # Free blocks in eviction order: the front is taken first. Uncached blocks go to the front, so a cached
        # block is only evicted when no empty one is left.
        self.free_ids: OrderedDict[int, None] = OrderedDict.fromkeys(range(num_blocks))
        self.cached: dict[bytes, int] = {}
        self.seqs: dict[int, Sequence] = {}  # holders of blocks, for integrity checks
        # Per holder: how many leading blocks cache_computed_blocks has already offered, so a step costs O(new).
        self.num_registered: dict[int, int] = {}
        self.stats = PrefixStats()

    # ---- queries -------------------------------------------------------------------------------------------
    @property
    def num_free_blocks(self) -> int:
        return len(self.free_ids)

    @property
    def usage(self) -> float:
        return 1.0 - len(self.free_ids) / self.num_blocks

    @property
    def capacity_tokens(self) -> int:
        return self.num_blocks * self.block_size

    def block_hashes(self, seq: Sequence, num_blocks: int) -> list[bytes]:
        """seq's memoised chained block hashes, extended to at least num_blocks full blocks (may hold more)."""
        bs, hashes = self.block_size, seq.block_hashes
        while len(hashes) < num_blocks:
            i = len(hashes)
            parent = hashes[-1] if hashes else ROOT_HASH
            hashes.append(hash_block(parent, seq.token_ids[i * bs:(i + 1) * bs]))
        return hashes

    def cached_prefix(self, seq: Sequence) -> list[int]:
        """Block ids of the longest cached prefix of seq, always leaving >= 1 token to compute so logits exist. None
        while seq still wants prompt-logprob rows, as in vLLM: a hit would skip them (its blocks are still cached)."""
        if not self.enable_prefix_caching or seq.wants_prompt_rows:
            return []
        num_full = (seq.num_tokens - 1) // self.block_size
        hashes, hits = self.block_hashes(seq, num_full), []
        for i in range(num_full):
            block_id = self.cached.get(hashes[i])
            if block_id is None:
                break
            hits.append(block_id)
        return hits

    def num_cached_prefix_tokens(self, seq: Sequence) -> int:
        return len(self.cached_prefix(seq)) * self.block_size

    # ---- admission: check / act ----------------------------------------------------------------------------
    def _blocks_to_take(self, hits: list[int], num_new_tokens: int) -> int:
        total = len(hits) * self.block_size + num_new_tokens
        revived = sum(1 for b in hits if self.blocks[b].ref_count == 0)  # hits sitting in the free list
        return cdiv(total, self.block_size) - len(hits) + revived

    def can_allocate(self, seq: Sequence, num_new_tokens: int | None = None) -> bool:
        """num_new_tokens counts tokens after the cached prefix; None means all of them."""
        hits = self.cached_prefix(seq)
        if num_new_tokens is None:
            num_new_tokens = seq.num_tokens - len(hits) * self.block_size
        return self._blocks_to_take(hits, num_new_tokens) <= len(self.free_ids)

    def allocate(self, seq: Sequence, num_new_tokens: int | None = None) -> int:
        """Map seq's cached prefix and room for num_new_tokens more; returns the prefix-hit length in tokens."""
        self._check_allocate(seq, num_new_tokens)
        hits = self.cached_prefix(seq)
        for block_id in hits:
            self._take(block_id)
        seq.block_table = list(hits)
        seq.num_computed_tokens = hit_tokens = len(hits) * self.block_size
        self._count_query(seq, hit_tokens)
        self.seqs[seq.seq_id] = seq
        self.num_registered[seq.seq_id] = len(hits)
        self.append_slots(seq, seq.num_tokens - hit_tokens if num_new_tokens is None else num_new_tokens)
        return hit_tokens

    def _check_allocate(self, seq: Sequence, num_new_tokens: int | None) -> None:
        if seq.block_table or seq.seq_id in self.seqs:
            raise RuntimeError(f"{seq!r} already holds blocks")
        room = seq.num_tokens - self.num_cached_prefix_tokens(seq)
        if num_new_tokens is not None and not 0 <= num_new_tokens <= room:
            raise ValueError(f"num_new_tokens={num_new_tokens} outside [0, {room}] for {seq!r}")
        if not self.can_allocate(seq, num_new_tokens):
            raise RuntimeError(f"not enough free KV blocks for {seq!r}; call can_allocate first")

    def _count_query(self, seq: Sequence, hit_tokens: int) -> None:
        if self.enable_prefix_caching:
            self.stats.queries += seq.num_tokens
            self.stats.hits += hit_tokens
        if seq.num_preemptions == 0:  # the reported figure is the first admission's, not a recompute's
            seq.num_cached_tokens = hit_tokens

    # ---- growth: check / act -------------------------------------------------------------------------------
    def _blocks_needed(self, seq: Sequence, num_new_tokens: int) -> int:
        return max(0, cdiv(seq.num_computed_tokens + num_new_tokens, self.block_size) - len(seq.block_table))

    def can_append(self, seq: Sequence, num_new_tokens: int) -> bool:
        return self._blocks_needed(seq, num_new_tokens) <= len(self.free_ids)

    def append_slots(self, seq: Sequence, num_new_tokens: int) -> list[int]:
        """Room for num_new_tokens after seq.num_computed_tokens; returns the newly added block ids."""
        needed = self._blocks_needed(seq, num_new_tokens)
        if not needed:  # most decode steps: the last block still has room
            return []
        if needed > len(self.free_ids):
            raise RuntimeError(f"not enough free KV blocks for {seq!r}; call can_append first")
        new = [self._pop_free() for _ in range(needed)]
        seq.block_table.extend(new)
        return new

    def room_tokens(self, seq: Sequence) -> int:
        """How many tokens past seq.num_computed_tokens its blocks and the free ones can hold."""
        return (len(seq.block_table) + len(self.free_ids)) * self.block_size - seq.num_computed_tokens

    def trim(self, seq: Sequence) -> None:
        """Release seq's blocks past its computed tokens (a verified draft's rejected tail: never cached, so free)."""
        keep = cdiv(seq.num_computed_tokens, self.block_size)
        for block_id in reversed(seq.block_table[keep:]):
            self._release(block_id)
        del seq.block_table[keep:]

    # ---- the free list -------------------------------------------------------------------------------------
    def _take(self, block_id: int) -> None:
        block = self.blocks[block_id]
        if block.ref_count == 0:
            del self.free_ids[block_id]
        block.ref_count += 1

    def _pop_free(self) -> int:
        block_id, _ = self.free_ids.popitem(last=False)
        block = self.blocks[block_id]
        if block.hash is not None:
            del self.cached[block.hash]
            block.hash = None
            self.stats.evictions += 1
        block.ref_count = 1
        return block_id

    def _release(self, block_id: int) -> None:
        block = self.blocks[block_id]
        block.ref_count -= 1
        if block.ref_count > 0:
            return
        self.free_ids[block_id] = None  # most recently used: evicted last
        if block.hash is None:
            self.free_ids.move_to_end(block_id, last=False)  # holds nothing reusable: hand it out first

    def free(self, seq: Sequence) -> None:
        # Tail first, so among one sequence's blocks the deep ones are evicted before the shared-prefix ones.
        for block_id in reversed(seq.block_table):
            self._release(block_id)
        seq.block_table = []
        self.seqs.pop(seq.seq_id, None)
        self.num_registered.pop(seq.seq_id, None)

    # ---- caching computed blocks ---------------------------------------------------------------------------
    def cache_computed_blocks(self, seq: Sequence) -> int:
        """Register seq's full, computed blocks; call after num_computed_tokens advances. Returns how many were new."""
        if not self.enable_prefix_caching:
            return 0
        done = self.num_registered.get(seq.seq_id, 0)
        full = min(seq.num_computed_tokens // self.block_size, len(seq.block_table))
        if full <= done:  # the common decode step: no block filled up, O(1)
            return 0
        hashes = self.block_hashes(seq, full)
        self.num_registered[seq.seq_id] = full
        return sum(self._register(seq.block_table[i], hashes[i]) for i in range(done, full))

    def _register(self, block_id: int, h: bytes) -> int:
        block = self.blocks[block_id]
        if block.hash is not None or h in self.cached:
            return 0  # already cached, or a twin computed concurrently (kept private, freed as empty)
        block.hash = h
        self.cached[h] = block_id
        return 1

    def reset_prefix_cache(self) -> int:
        """Forget every cached block that no sequence holds; returns how many were dropped."""
        dropped = [b for b in self.free_ids if self.blocks[b].hash is not None]
        for block_id in dropped:
            del self.cached[self.blocks[block_id].hash]
            self.blocks[block_id].hash = None
            self.free_ids.move_to_end(block_id, last=False)
        return len(dropped)

    # ---- integrity -----------------------------------------------------------------------------------------
    def check_integrity(self) -> None:
        refs = [0] * self.num_blocks
        for seq in self.seqs.values():
            require(len(set(seq.block_table)) == len(seq.block_table), f"{seq!r} maps a block twice")
            for block_id in seq.block_table:
                refs[block_id] += 1
        for block in self.blocks:
            require(block.ref_count == refs[block.block_id], f"block {block.block_id}: ref {block.ref_count} != {refs[block.block_id]}")
            require((block.ref_count == 0) == (block.block_id in self.free_ids), f"block {block.block_id} free list")
            if block.hash is not None:
                require(self.cached.get(block.hash) == block.block_id, f"block {block.block_id} hash map")
        require(len(self.cached) == sum(b.hash is not None for b in self.blocks), "stale hash map entries")
        require(set(self.num_registered) <= set(self.seqs), "registration cursor of a sequence holding no blocks")
        for seq in self.seqs.values():
            self._check_seq_hashes(seq)

    def _check_seq_hashes(self, seq: Sequence) -> None:
        # A cached block in a table must sit at the position whose chained hash it carries.
        for i, block_id in enumerate(seq.block_table):
            h = self.blocks[block_id].hash
            if h is not None:
                require((i + 1) * self.block_size <= seq.num_computed_tokens, f"{seq!r}: uncomputed block {i} cached")
                require(self.block_hashes(seq, i + 1)[i] == h, f"{seq!r}: block {i} hash mismatch")
