"""Batch invariance of paged attention on the CPU path: the three invariants bit for bit, accuracy, negative controls.

The scenario helpers here are reused by triton/test_attention.py (interpreter) and triton/test_attention_gpu.py (H200).
"""
from __future__ import annotations

import dataclasses
import itertools
import random
from dataclasses import dataclass

import pytest
import torch

from samebits.kernels.attention import (
    AttentionMetadata,
    AttentionUnsupported,
    paged_attention,
    paged_attention_reference,
)
from samebits.kernels.cpu import gemm as cpu_gemm
from samebits.kernels.cpu.attention import paged_attention_cpu
from samebits.kernels.kv_cache import allocate_kv_cache, write_kv
from samebits.probe.compare import assert_same_bits, mismatch


@dataclass
class World:
    """Sequences whose whole K/V already sit in a paged cache with scattered blocks; q holds every position's query."""
    q: list[torch.Tensor]  # per sequence [L, Hq, D]
    tables: list[list[int]]
    k_cache: torch.Tensor
    v_cache: torch.Tensor
    scale: float


def make_world(lens, hq, hkv, d, block_size, dtype=torch.bfloat16, seed=0, device="cpu",
               stale: float | None = None) -> World:
    """Sequences of `lens` tokens in scattered pages; `stale`: what every slot that holds no key reads (a reused
    page's old keys, NaN at worst), which no output may depend on."""
    gen = torch.Generator().manual_seed(seed)
    total = sum(lens)
    k = torch.randn(total, hkv, d, generator=gen).to(dtype).to(device)
    v = torch.randn(total, hkv, d, generator=gen).to(dtype).to(device)
    q = torch.randn(total, hq, d, generator=gen).to(dtype).to(device)
    n_blocks = sum(-(-n // block_size) for n in lens) + 2
    (k_cache, v_cache), = allocate_kv_cache(1, n_blocks, block_size, hkv, d, dtype, device)
    if stale is not None:
        k_cache.fill_(stale)
        v_cache.fill_(stale)
    order = torch.randperm(n_blocks, generator=gen).tolist()  # scattered pages: the table, not adjacency, orders keys
    tables, at = [], 0
    for n in lens:
        tables.append(order[at:at + -(-n // block_size)])
        at += len(tables[-1])
    meta = AttentionMetadata.build(lens, lens, tables, block_size, device)
    write_kv(k, v, k_cache, v_cache, meta.slot_mapping)
    return World(list(q.split(list(lens))), tables, k_cache, v_cache, d ** -0.5)


def run(world: World, reqs, attn=paged_attention, **kw) -> list[torch.Tensor]:
    """One batched call; reqs = [(seq, context_len, query_len)]. Returns each request's output rows."""
    block_size = world.k_cache.shape[1]
    meta = AttentionMetadata.build([r[2] for r in reqs], [r[1] for r in reqs], [world.tables[r[0]] for r in reqs],
                                   block_size, world.k_cache.device)
    q = torch.cat([world.q[s][ctx - n:ctx] for s, ctx, n in reqs])
    out = attn(q, world.k_cache, world.v_cache, meta, world.scale, **kw)
    return list(out.split([r[2] for r in reqs]))


def full_prefill(world: World, attn=paged_attention, **kw) -> list[torch.Tensor]:
    return run(world, [(s, len(q), len(q)) for s, q in enumerate(world.q)], attn, **kw)


def chunked(world: World, seq: int, cuts: list[int], attn=paged_attention, **kw) -> torch.Tensor:
    """Prefill of one sequence in steps ending at each cut (and at its length)."""
    ends = sorted(set(cuts) | {len(world.q[seq])})
    outs, start = [], 0
    for end in ends:
        outs += run(world, [(seq, end, end - start)], attn, **kw)
        start = end
    return torch.cat(outs)


def random_cuts(rng: random.Random, length: int, n: int) -> list[int]:
    return sorted(rng.sample(range(1, length), min(n, length - 1))) if length > 1 else []


SHAPES = [(64, 4, 4), (64, 8, 2), (128, 6, 2), (128, 8, 1)]  # (D, Hq, Hkv): GQA ratios 1, 4, 3, 8
LENS = [1, 2, 63, 64, 65, 255, 256, 257, 520, 700]  # tile and split edges, three splits


@pytest.mark.parametrize("d,hq,hkv", SHAPES)
def test_batch_composition_does_not_change_a_sequence(d, hq, hkv):
    world = make_world(LENS, hq, hkv, d, 16, seed=d + hq)
    alone = [run(world, [(s, len(q), len(q))])[0] for s, q in enumerate(world.q)]
    rng = random.Random(1)
    for trial in range(3):
        order = rng.sample(range(len(LENS)), rng.randint(2, len(LENS)))
        batched = run(world, [(s, len(world.q[s]), len(world.q[s])) for s in order])
        for s, out in zip(order, batched):
            assert_same_bits(out, alone[s], f"seq {s} (len {LENS[s]}) in batch {order}")


@pytest.mark.parametrize("d,hq,hkv", SHAPES)
def test_prefill_equals_chunked_prefix_hit_and_decode(d, hq, hkv):
    world = make_world(LENS, hq, hkv, d, 16, seed=3 * d + hkv)
    full = full_prefill(world)
    rng = random.Random(d * hq)
    for s, length in enumerate(LENS):
        for _ in range(2):
            cuts = random_cuts(rng, length, rng.randint(1, 6))
            assert_same_bits(chunked(world, s, cuts), full[s], f"seq {s} chunked at {cuts}")
        hit = rng.randint(0, length - 1)  # prefix cache covers positions < hit
        assert_same_bits(run(world, [(s, length, length - hit)])[0], full[s][hit:], f"seq {s} prefix hit {hit}")
    # Decode steps of every sequence, batched together as an engine would, at random positions.
    for _ in range(6):
        reqs = [(s, rng.randint(1, n), 1) for s, n in enumerate(LENS)]
        rng.shuffle(reqs)
        for (s, ctx, _), out in zip(reqs, run(world, reqs)):
            assert_same_bits(out, full[s][ctx - 1:ctx], f"seq {s} decode at position {ctx - 1}")


@pytest.mark.parametrize("d,hq,hkv", [(64, 8, 2)])
def test_verify_chunks_batched_equal_prefill(d, hq, hkv):
    """Speculative decoding's verify chunks (1 + k rows ending anywhere, engine/spec_decode/) of every sequence in one
    call, those of equal rows and tiles in one group as decode rows are: each row has its full prefill's bits."""
    world = make_world(LENS, hq, hkv, d, 16, seed=5 * d + hq)
    full = full_prefill(world)
    rng = random.Random(d + hkv)
    for k in (2, 8):
        reqs = [(s, rng.randint(min(n, k + 1), n), min(n, k + 1)) for s, n in enumerate(LENS)]
        reqs += [(s, ctx + 1, n) for s, ctx, n in reqs if ctx < LENS[s]]  # a neighbour: often the same group
        rng.shuffle(reqs)
        for (s, ctx, n), out in zip(reqs, run(world, reqs)):
            assert_same_bits(out, full[s][ctx - n:ctx], f"seq {s} verify chunk of {n} rows ending at {ctx}")


@pytest.mark.parametrize("d,hq,hkv", [(64, 8, 2)])
def test_every_position_decodes_to_its_prefill_bits(d, hq, hkv):
    world = make_world([400], hq, hkv, d, 16, seed=7)
    full = full_prefill(world)[0]
    decoded = torch.cat([run(world, [(0, t + 1, 1)])[0] for t in range(400)])
    assert_same_bits(decoded, full, "decode at every position vs prefill")


def test_page_size_does_not_change_bits():
    outs = [full_prefill(make_world([300, 77], 8, 2, 64, bs, seed=5)) for bs in (1, 16, 64)]
    for other in outs[1:]:
        for a, b in zip(outs[0], other):
            assert_same_bits(b, a, "page size 1 vs 16/64")


def test_a_steps_plan_serves_every_layer_and_every_knob_gets_its_own():
    """The CPU path derives its gather plan from the metadata once (AttentionMetadata.derived) and every layer reuses
    it: with one metadata object, other caches (another layer) and other tile knobs give the bits a fresh metadata
    gives; a plan that ignored the caches or the knobs would hand one layer's keys or tiles to the next."""
    world = make_world([150, 20, 60], 9, 3, 64, 16, seed=29)
    other = make_world([150, 20, 60], 9, 3, 64, 16, seed=31)  # the next layer: other keys, values and queries
    reqs = [(1, 20, 1), (0, 150, 30), (2, 60, 1)]
    meta = AttentionMetadata.build([r[2] for r in reqs], [r[1] for r in reqs], [world.tables[r[0]] for r in reqs],
                                   16, "cpu")

    def call(w, m, **kw):
        q = torch.cat([w.q[s][ctx - n:ctx] for s, ctx, n in reqs])
        return paged_attention_cpu(q, w.k_cache, w.v_cache, m, w.scale, **kw)

    def fresh():
        return dataclasses.replace(meta)

    other.k_cache.copy_(world.k_cache.flip(0))  # the same tables then read other keys
    other.v_cache.copy_(world.v_cache.flip(0))
    for w, kw in [(world, {}), (other, {}), (world, {"tile": 64})]:
        assert_same_bits(call(w, meta, **kw), call(w, fresh(), **kw), f"plan reused for {kw}")
    assert not mismatch(call(other, meta), call(world, meta)).same  # the control: layers do differ


def test_run_to_run():
    world = make_world([5, 300, 129], 8, 2, 128, 16, seed=11)
    first = torch.cat(full_prefill(world))
    for _ in range(3):
        assert_same_bits(torch.cat(full_prefill(world)), first, "repeat run")


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 2e-6), (torch.float16, 1e-3), (torch.bfloat16, 6e-3)])
@pytest.mark.parametrize("d,hq,hkv", [(64, 8, 2), (128, 6, 2)])
def test_close_to_float64_reference(dtype, bound, d, hq, hkv):
    world = make_world([1, 90, 600], hq, hkv, d, 16, dtype=dtype, seed=13)
    reqs = [(0, 1, 1), (1, 90, 90), (2, 600, 350)]
    out = torch.cat(run(world, reqs))
    ref = torch.cat(run(world, reqs, paged_attention_reference))
    rel = float((out.double() - ref).norm() / ref.norm())
    assert rel < bound, f"{dtype}: relative error {rel:.2e} over {bound:.0e}"
    fast = torch.cat(run(world, reqs, deterministic=False))
    assert float((fast.double() - ref).norm() / ref.norm()) < bound


def test_empty_query_sequence_in_batch():
    world = make_world([40, 50], 4, 2, 64, 16, seed=17)
    outs = run(world, [(0, 40, 0), (1, 50, 50)])
    assert outs[0].shape[0] == 0
    assert_same_bits(outs[1], full_prefill(world)[1], "neighbour with no queries")


# ---- negative controls: the same comparisons catch a kernel whose order depends on the batch -------------------------


def batch_dependent_tile(q, k_cache, v_cache, meta, scale):
    """A deliberately batch-variant kernel: it picks a smaller KV tile when the batch holds more than one sequence."""
    tile = 64 if meta.num_seqs == 1 else 32
    return paged_attention_cpu(q, k_cache, v_cache, meta, scale, tile=tile)


def decode_specialised_tile(q, k_cache, v_cache, meta, scale):
    """A deliberately prefill/decode-variant kernel: decode-only batches use a smaller KV tile."""
    tile = 32 if meta.max_query_len == 1 else 64
    return paged_attention_cpu(q, k_cache, v_cache, meta, scale, tile=tile)


def test_a_cpu_that_admits_only_the_canonical_block_gives_the_same_bits(monkeypatch):
    """Which row blocks a machine's MKL admits varies (an Intel Xeon at ATen's AVX2 capability admitted none above the
    canonical 64 rows): the CPU path cuts its query chunks to the largest admitted block, and every row keeps its
    bits. Negative control: the same comparison sees another KV tile."""
    world = make_world([300, 77], 8, 2, 64, 16, seed=31)  # chunks of up to 256 rows = 64 tokens of GQA 4
    reqs = [(0, 300, 300), (1, 77, 77), (1, 60, 1)]
    every = run(world, reqs, paged_attention_cpu)
    monkeypatch.setattr(cpu_gemm, "verdict", lambda k, n: cpu_gemm.Verdict((cpu_gemm.CANONICAL,), True))
    for got, want in zip(run(world, reqs, paged_attention_cpu), every):
        assert_same_bits(got, want, "canonical block only")
    assert not mismatch(run(world, reqs[:1], paged_attention_cpu, tile=64)[0], every[0]).same


def test_negative_control_batch_dependent_tile_is_caught():
    world = make_world([300, 77, 130], 8, 2, 64, 16, seed=19)
    alone = run(world, [(0, 300, 300)], batch_dependent_tile)[0]
    batched = run(world, [(1, 77, 77), (0, 300, 300), (2, 130, 130)], batch_dependent_tile)[1]
    assert not mismatch(batched, alone).same
    with pytest.raises(AssertionError):
        assert_same_bits(batched, alone, "control")


def test_negative_control_decode_specialised_tile_is_caught():
    world = make_world([300], 8, 2, 64, 16, seed=23)
    full = full_prefill(world, decode_specialised_tile)[0]
    decoded = torch.cat([run(world, [(0, t + 1, 1)], decode_specialised_tile)[0] for t in range(100, 300)])
    assert not mismatch(decoded, full[100:]).same


class SettlingTile:
    """A deliberately run-to-run-variant kernel: like an autotuner, it changes its KV tile after the first call."""

    def __init__(self):
        self.calls = 0

    def __call__(self, q, k_cache, v_cache, meta, scale):
        self.calls += 1
        return paged_attention_cpu(q, k_cache, v_cache, meta, scale, tile=64 if self.calls == 1 else 32)


def test_negative_control_run_to_run_variation_is_caught():
    world = make_world([5, 300, 129], 8, 2, 128, 16, seed=11)
    kernel = SettlingTile()
    first = torch.cat(full_prefill(world, kernel))
    assert not mismatch(torch.cat(full_prefill(world, kernel)), first).same


# ---- fail loud --------------------------------------------------------------------------------------------------------


def test_unsupported_inputs_fail_loud():
    world = make_world([10], 4, 2, 64, 16, seed=29)
    meta = AttentionMetadata.build([10], [10], world.tables, 16)
    q = world.q[0]
    with pytest.raises(AttentionUnsupported, match="dtype"):
        paged_attention(q.float(), world.k_cache, world.v_cache, meta, 0.1)
    with pytest.raises(AttentionUnsupported, match="GQA group"):
        big = torch.zeros(10, 130, 64, dtype=q.dtype)
        paged_attention(big, world.k_cache[:, :, :1], world.v_cache[:, :, :1], meta, 0.1)
    with pytest.raises(AttentionUnsupported, match="device"):
        paged_attention(q.to("meta"), world.k_cache.to("meta"), world.v_cache.to("meta"), meta, 0.1)


def test_metadata_build_checks_and_slots():
    meta = AttentionMetadata.build([2, 1], [5, 3], [[7, 2], [4]], 4)
    assert meta.cu_seqlens_q.tolist() == [0, 2, 3]
    # positions 3, 4 of seq 0 -> block 7 offset 3, block 2 offset 0; position 2 of seq 1 -> block 4 offset 2
    assert meta.slot_mapping.tolist() == [7 * 4 + 3, 2 * 4 + 0, 4 * 4 + 2]
    assert meta.block_tables.tolist() == [[7, 2], [4, 0]]
    assert (meta.max_query_len, meta.max_context_len, meta.leading_decodes) == (2, 5, 0)
    counts = [AttentionMetadata.build(q, [3] * len(q), [[0]] * len(q), 4).leading_decodes
              for q in ([1, 1, 3, 1], [1, 1], [2, 1], [])]
    assert counts == [2, 2, 0, 0], counts
    with pytest.raises(ValueError, match="blocks"):
        AttentionMetadata.build([1], [9], [[0, 1]], 4)
    with pytest.raises(ValueError, match="query_len"):
        AttentionMetadata.build([4], [3], [[0]], 4)


def test_metadata_build_takes_tables_as_lists_tensors_or_arrays_and_slots_every_token(seed):
    """The engine's list tables, a tensor, and rows of other int types give one metadata; every new token's slot is
    kv_slot of its position (decode rows and prefill chunks alike)."""
    import numpy as np

    from samebits.arith import kv_slot

    rng = random.Random(seed)
    bs = 4
    ctx = [rng.randrange(1, 40) for _ in range(12)]
    q = [rng.choice([1, 1, c]) if c > 1 else 1 for c in ctx]
    width = max(-(-c // bs) for c in ctx)
    lists = [[rng.randrange(1000) for _ in range(-(-c // bs))] for c in ctx]
    padded = torch.tensor([t + [0] * (width - len(t)) for t in lists])
    metas = [AttentionMetadata.build(q, ctx, tables, bs) for tables in (lists, padded, [np.array(t) for t in lists])]
    want = [kv_slot(t, p, bs) for t, c, n in zip(lists, ctx, q) for p in range(c - n, c)]
    for meta in metas:
        assert meta.slot_mapping.tolist() == want and meta.cu_seqlens_q.tolist() == [0, *itertools.accumulate(q)]
        assert meta.block_tables.dtype == torch.int32 and meta.block_tables.tolist() == padded.tolist()
    other = AttentionMetadata.build(q, ctx, [[b + 1 for b in t] for t in lists], bs)  # control: other blocks
    assert other.slot_mapping.tolist() != want
