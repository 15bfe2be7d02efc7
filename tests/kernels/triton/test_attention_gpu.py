"""The attention invariants at real sizes on a GPU: thousands of rows and positions, where the rare layout-dependent
differences show up. Lengths 1..3000, decode at every position, many chunk cuts, GQA 1/4/8, head dims 64 and 128."""
from __future__ import annotations

import random

import pytest
import torch

from samebits.kernels.attention import paged_attention, paged_attention_reference
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.test_attention import full_prefill, make_world, random_cuts, run

pytestmark = pytest.mark.gpu

CASES = [  # (D, Hq, Hkv, dtype)
    (128, 32, 8, torch.bfloat16),
    (64, 16, 16, torch.bfloat16),
    (128, 8, 1, torch.float16),
    (64, 12, 4, torch.bfloat16),
]


def lengths(seed: int) -> list[int]:
    rng = random.Random(seed)
    return [1, 2, 63, 64, 65, 255, 256, 257, 3000] + [rng.randint(1, 3000) for _ in range(7)]


def world_for(d, hq, hkv, dtype, block_size=16, seed=0, stale=None):
    return make_world(lengths(seed), hq, hkv, d, block_size, dtype=dtype, seed=seed, device="cuda", stale=stale)


def pa(q, k_cache, v_cache, meta, scale, parallel_splits=None, split_decodes=None):
    from samebits.kernels.triton import attention

    return attention.paged_attention(q, k_cache, v_cache, meta, scale, parallel_splits=parallel_splits,
                                     split_decodes=split_decodes)


@pytest.mark.parametrize("d,hq,hkv,dtype", CASES)
def test_batch_composition(d, hq, hkv, dtype):
    world = world_for(d, hq, hkv, dtype, seed=d + hq)
    full = full_prefill(world, pa)
    rng = random.Random(0)
    for s, q in enumerate(world.q):
        assert_same_bits(run(world, [(s, len(q), len(q))], pa)[0], full[s], f"seq {s} (len {len(q)}) alone")
    for _ in range(3):
        order = rng.sample(range(len(world.q)), rng.randint(2, len(world.q)))
        outs = run(world, [(s, len(world.q[s]), len(world.q[s])) for s in order], pa)
        for s, out in zip(order, outs):
            assert_same_bits(out, full[s], f"seq {s} in batch {order}")
    assert_same_bits(torch.cat(full_prefill(world, pa)), torch.cat(full), "run to run")


@pytest.mark.parametrize("d,hq,hkv,dtype", CASES)
def test_decode_at_every_position_equals_prefill(d, hq, hkv, dtype):
    world = world_for(d, hq, hkv, dtype, seed=2 * d + hkv)
    full = full_prefill(world, pa)
    # Every position of every sequence as one decode step, all in one batch (≈ 10k rows), both split strategies.
    reqs = [(s, t + 1, 1) for s, q in enumerate(world.q) for t in range(len(q))]
    random.Random(1).shuffle(reqs)
    for parallel in (True, False):
        outs = run(world, reqs, pa, parallel_splits=parallel)
        got = torch.cat([outs[i] for i in sorted(range(len(reqs)), key=lambda i: (reqs[i][0], reqs[i][1]))])
        assert_same_bits(got, torch.cat(full), f"decode at every position, parallel splits {parallel}")


@pytest.mark.parametrize("d,hq,hkv,dtype", CASES)
def test_mixed_batch_decodes_in_their_own_launch_equal_prefill(d, hq, hkv, dtype, monkeypatch):
    """A mixed batch (every sequence decoding at a random position, then every sequence's prompt again as a chunk):
    its leading decodes take the decode-tile launch; each row equals the full prefill's, and the one-launch form's."""
    world = world_for(d, hq, hkv, dtype, seed=7 * d + hq)
    full = full_prefill(world, pa)
    rng = random.Random(d + hkv)
    at = [rng.randint(1, len(q)) for q in world.q]
    reqs = [(s, t, 1) for s, t in enumerate(at)] + [(s, len(q), len(q) - len(q) // 3) for s, q in enumerate(world.q)]
    mixed = run(world, reqs, pa)
    for (s, t, n), out in zip(reqs, mixed):
        assert_same_bits(out, full[s][t - n:t], f"seq {s}, {n} new of {t}, in the mixed batch")
    assert_same_bits(torch.cat(run(world, reqs, pa, split_decodes=False)), torch.cat(mixed), "one launch")
    # Negative control: the same comparison sees another fold order (512-token splits).
    from samebits.kernels.triton import attention

    monkeypatch.setattr(attention, "SPLIT", 512)
    assert not mismatch(torch.cat(run(world, reqs, pa)), torch.cat(mixed)).same


@pytest.mark.parametrize("d,hq,hkv,dtype", CASES[:1])
def test_a_graph_sized_grid_equals_the_folded_launch(d, hq, hkv, dtype, monkeypatch):
    """Decode with a grid of more splits than the rows reach (max_context_len = 8192, as a CUDA graph for
    max_model_len 8192 captures) gives the folded launch's bits at every 7th position."""
    import dataclasses

    world = world_for(d, hq, hkv, dtype, seed=11 * d + hq)
    reqs = [(s, t + 1, 1) for s, q in enumerate(world.q) for t in range(0, len(q), 7)]

    def wide(q, k, v, meta, scale):
        return pa(q, k, v, dataclasses.replace(meta, max_context_len=8192), scale, parallel_splits=True)

    folded = torch.cat(run(world, reqs, pa, parallel_splits=False))
    assert_same_bits(torch.cat(run(world, reqs, wide)), folded, "an 8-split grid vs the folded launch")
    from samebits.kernels.triton import attention

    monkeypatch.setattr(attention, "SPLIT", 512)  # negative control: another fold order is seen
    assert not mismatch(torch.cat(run(world, reqs, wide)), folded).same


@pytest.mark.parametrize("d,hq,hkv,dtype", CASES)
def test_verify_chunks_equal_prefill(d, hq, hkv, dtype):
    """Speculative decoding's verify chunks (engine/spec_decode/): 5 and 9 rows ending at every 7th position of every
    sequence, in one launch, splits folded or parallel, and on a verify graph's grid (max_context_len 8192): each row
    has the full prefill's bits."""
    import dataclasses

    world = world_for(d, hq, hkv, dtype, seed=13 * d + hq)
    full = full_prefill(world, pa)

    def wide(q, k, v, meta, scale):
        return pa(q, k, v, dataclasses.replace(meta, max_context_len=8192), scale)

    for rows in (5, 9):
        reqs = [(s, t, rows) for s, x in enumerate(world.q) for t in range(rows, len(x) + 1, 7)]
        want = torch.cat([full[s][t - n:t] for s, t, n in reqs])
        for name, attn, kw in (("folded", pa, {"parallel_splits": False}), ("parallel", pa, {"parallel_splits": True}),
                               ("graph grid", wide, {})):
            assert_same_bits(torch.cat(run(world, reqs, attn, **kw)), want, f"{rows}-row verify chunks, {name}")


def test_the_fused_merge_equals_the_merge_kernel_under_load(monkeypatch):
    """Thousands of decode rows in one launch with splits in parallel (every 5th position of 16 sequences up to 3000
    tokens, tens of thousands of programs racing for their tiles' counters): the fused merge gives the merge kernel's
    bits in each of 5 launches and leaves every counter at 0. Negative control: another fold order is seen."""
    from samebits.kernels.triton import attention

    world = world_for(128, 32, 8, torch.bfloat16, seed=29)
    reqs = [(s, t + 1, 1) for s, q in enumerate(world.q) for t in range(0, len(q), 5)]
    monkeypatch.setattr(attention, "FUSED_MERGE", False)
    kernel = torch.cat(run(world, reqs, pa, parallel_splits=True))
    monkeypatch.setattr(attention, "FUSED_MERGE", True)
    counters = attention._counters(torch.device("cuda", torch.cuda.current_device()), 1)
    for i in range(5):
        assert_same_bits(torch.cat(run(world, reqs, pa, parallel_splits=True)), kernel, f"fused merge, launch {i}")
        assert int(counters.count_nonzero()) == 0, f"launch {i} left a counter nonzero"
    monkeypatch.setattr(attention, "SPLIT", 512)
    assert not mismatch(torch.cat(run(world, reqs, pa, parallel_splits=True)), kernel).same


@pytest.mark.parametrize("d,hq,hkv,dtype", CASES)
def test_chunked_prefill_and_prefix_hits(d, hq, hkv, dtype):
    world = world_for(d, hq, hkv, dtype, seed=3 * d + hq)
    full = full_prefill(world, pa)
    rng = random.Random(d)
    for trial in range(4):
        # Each sequence cut at its own random points; step i batches every sequence's i-th chunk, as an engine would.
        plans = []
        for s, q in enumerate(world.q):
            ends = sorted(set(random_cuts(rng, len(q), rng.randint(1, 12))) | {len(q)})
            plans.append([(s, e, e - b) for b, e in zip([0] + ends[:-1], ends)])
        got: dict[int, list] = {s: [] for s in range(len(world.q))}
        for step in range(max(len(p) for p in plans)):
            reqs = [p[step] for p in plans if step < len(p)]
            for (s, _, _), out in zip(reqs, run(world, reqs, pa, parallel_splits=trial % 2 == 1)):
                got[s].append(out)
        for s, outs in got.items():
            assert_same_bits(torch.cat(outs), full[s], f"seq {s} chunked, trial {trial}")
    hits = [(s, len(q), len(q) - rng.randint(0, len(q) - 1)) for s, q in enumerate(world.q)]
    for (s, ctx, n), out in zip(hits, run(world, hits, pa)):
        assert_same_bits(out, full[s][ctx - n:], f"seq {s} prefix hit at {ctx - n}")


@pytest.mark.parametrize("rows,warps,stages", [(64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 8, 2), (128, 8, 4)])
def test_every_prefill_tile_gives_the_committed_bits(rows, warps, stages, monkeypatch):
    """Prefill tiles put the rows on the MMA's M side, decode tiles on N: one warpgroup of 64 rows, two sharing the N
    side (64 rows, 8 warps), two of 64 rows each (128 rows, 8 warps, committed at 3 stages), 2 to 4 stages, all give
    the committed launch's bits, which decode equals (test_decode_at_every_position_equals_prefill;
    docs/results/mma_roles.h200.json)."""
    from samebits.kernels.triton import attention

    world = world_for(128, 32, 8, torch.bfloat16, seed=rows + warps + stages)
    reqs = [(s, len(q), len(q)) for s, q in enumerate(world.q)] + [(8, 3000, 2000)]  # seq 8: 3000 tokens
    committed = torch.cat(run(world, reqs, pa))
    monkeypatch.setattr(attention, "PREFILL_WARPS", warps)
    monkeypatch.setattr(attention, "NUM_STAGES", stages)
    got = torch.cat(run(world, reqs, lambda *a, **kw: attention.paged_attention(*a, rows=rows, **kw)))
    assert_same_bits(got, committed, f"prefill tile of {rows} rows, {warps} warps, {stages} stages")
    # Negative control: the same comparison sees another fold order (512-token splits).
    monkeypatch.setattr(attention, "SPLIT", 512)
    assert not mismatch(torch.cat(run(world, reqs, pa)), committed).same


@pytest.mark.parametrize("bs,tma", [(32, True), (64, True), (64, False), (128, True), (256, True)])
def test_page_size_does_not_change_bits(bs, tma, monkeypatch):
    """Pages of 64 tokens and more hold whole KV tiles and take one block id per tile (_tile_blocks), their tiles
    through TMA descriptors (or gathered: TMA_LOADS off); smaller ones gather key by key: prefill and decode at every position (both split strategies) against
    16-token pages, with NaN in every slot that holds no key."""
    from samebits.kernels.triton import attention

    monkeypatch.setattr(attention, "TMA_LOADS", tma)
    ref = torch.cat(full_prefill(world_for(128, 32, 8, torch.bfloat16, block_size=16, seed=9), pa))
    world = world_for(128, 32, 8, torch.bfloat16, block_size=bs, seed=9, stale=float("nan"))
    assert_same_bits(torch.cat(full_prefill(world, pa)), ref, f"prefill, page {bs}")
    reqs = [(s, t + 1, 1) for s, q in enumerate(world.q) for t in range(len(q))]
    for parallel in (False, True):
        got = torch.cat(run(world, reqs, pa, parallel_splits=parallel))
        assert_same_bits(got, ref, f"decode at every position, page {bs}, parallel splits {parallel}")
    # Negative control: the same comparison sees another fold order (512-token splits).
    monkeypatch.setattr(attention, "SPLIT", 512)
    assert not mismatch(torch.cat(full_prefill(world, pa)), ref).same


@pytest.mark.parametrize("d,hq,hkv,dtype", CASES)
def test_accuracy_vs_float64(d, hq, hkv, dtype):
    world = world_for(d, hq, hkv, dtype, seed=11)
    reqs = [(s, len(q), min(len(q), 300)) for s, q in enumerate(world.q)]
    out = torch.cat(run(world, reqs, paged_attention))
    ref = torch.cat(run(world, reqs, paged_attention_reference))
    rel = float((out.double() - ref).norm() / ref.norm())
    assert rel < {torch.bfloat16: 6e-3, torch.float16: 1e-3}[dtype], rel


def test_fp32_inputs_use_exact_products():
    world = make_world([700, 33], 8, 2, 128, 16, dtype=torch.float32, seed=13, device="cuda")
    reqs = [(0, 700, 700), (1, 33, 33)]
    out = torch.cat(run(world, reqs, paged_attention))
    ref = torch.cat(run(world, reqs, paged_attention_reference))
    assert float((out.double() - ref).norm() / ref.norm()) < 1e-5  # tf32 would give ~3e-4


# ---- negative controls on the GPU --------------------------------------------------------------------------------------


def test_negative_control_sdpa_decode_differs_from_its_prefill():
    """torch SDPA: the same row computed in a causal prefill and as a one-token decode comes out different somewhere."""
    import torch.nn.functional as F

    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(1, 32, 3000, 128, device="cuda", generator=gen, dtype=torch.bfloat16) for _ in range(3))
    prefill = F.scaled_dot_product_attention(q, k, v, is_causal=True)
    decode = torch.cat([F.scaled_dot_product_attention(q[:, :, t:t + 1], k[:, :, :t + 1], v[:, :, :t + 1])
                        for t in range(0, 3000, 13)], dim=2)
    assert not mismatch(decode, prefill[:, :, ::13]).same


def test_negative_control_other_kv_tile_is_caught():
    """The comparison used above catches a decode kernel built with another KV tile (BLOCK_N 32 instead of 64)."""
    from samebits.kernels.triton import attention as at

    world = world_for(128, 32, 8, torch.bfloat16, seed=17)
    full = full_prefill(world, pa)
    block_n = at.BLOCK_N
    try:
        at.BLOCK_N = 32
        reqs = [(s, t + 1, 1) for s, q in enumerate(world.q) for t in range(0, len(q), 5)]
        outs = run(world, reqs, pa, parallel_splits=False)
    finally:
        at.BLOCK_N = block_n
    want = torch.cat([full[s][t - 1:t] for s, t, _ in reqs])
    assert not mismatch(torch.cat(outs), want).same
