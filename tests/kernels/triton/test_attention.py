"""The Triton paged attention and split merge on small shapes: under TRITON_INTERPRET=1 on a CPU machine, natively on
a GPU. The same invariants as the CPU path, bit for bit."""
from __future__ import annotations

import dataclasses
import random
import warnings

import pytest
import torch

from samebits.kernels import get_ops
from samebits.kernels.attention import paged_attention_reference
from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.test_attention import full_prefill, make_world, random_cuts, run

pytestmark = pytest.mark.interpreter
triton_ops = pytest.importorskip("samebits.kernels.triton.attention")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tri(q, k_cache, v_cache, meta, scale, parallel_splits=None, split_decodes=None):
    return triton_ops.paged_attention(q, k_cache, v_cache, meta, scale, parallel_splits=parallel_splits,
                                      split_decodes=split_decodes)


# (D, Hq, Hkv, lens): one GQA-4 head-dim-64 case crossing a split, one GQA-3 head-dim-128 case. Kept small: the
# interpreter runs every program in numpy.
CASES = [(64, 8, 2, [1, 30, 70, 290]), (128, 3, 1, [2, 66, 130])]


@pytest.mark.parametrize("d,hq,hkv,lens", CASES)
def test_triton_invariants(d, hq, hkv, lens):
    world = make_world(lens, hq, hkv, d, 16, seed=d, device=DEVICE)
    full = full_prefill(world, tri)
    rng = random.Random(d)
    # 1: batch composition and position in the batch.
    for s in range(len(lens)):
        assert_same_bits(run(world, [(s, lens[s], lens[s])], tri)[0], full[s], f"seq {s} alone")
    # 2: chunked prefill at random cuts (all sequences in one batch per step would also do; one sequence is cheaper),
    # prefix hits, and decode steps batched with sequential and with parallel splits.
    s = len(lens) - 1
    cuts = random_cuts(rng, lens[s], 3)
    ends = sorted(set(cuts) | {lens[s]})
    steps = [(s, e, e - b) for b, e in zip([0] + ends[:-1], ends)]
    got = torch.cat([run(world, [step, (0, lens[0], lens[0])], tri)[0] for step in steps])
    assert_same_bits(got, full[s], f"seq {s} chunked at {cuts}")
    hit = rng.randint(1, lens[s] - 1)
    assert_same_bits(run(world, [(s, lens[s], lens[s] - hit)], tri)[0], full[s][hit:], f"prefix hit {hit}")
    positions = sorted(rng.sample(range(lens[s]), 6) + [lens[s] - 1])
    for parallel in (False, True):
        outs = run(world, [(s, t + 1, 1) for t in positions], tri, parallel_splits=parallel)
        for t, out in zip(positions, outs):
            assert_same_bits(out, full[s][t:t + 1], f"decode at {t}, parallel splits {parallel}")
    # 3: run to run.
    assert_same_bits(torch.cat(full_prefill(world, tri)), torch.cat(full), "repeat run")


@pytest.mark.parametrize("tma,dtype", [(True, torch.bfloat16), (False, torch.bfloat16), (True, torch.float32)])
def test_one_page_tiles_equal_gathered_tiles(tma, dtype, monkeypatch):
    """Pages of a whole KV tile or more take one block id per tile (_tile_blocks) and load their tiles through TMA
    descriptors (or gathered: TMA_LOADS off); their bits
    are those of 16-token pages gathered key by key: prefill and decode steps, splits folded and parallel, with NaN in
    every slot that holds no key. Negative control: the same comparison sees another fold order."""
    monkeypatch.setattr(triton_ops, "TMA_LOADS", tma)
    monkeypatch.setattr(triton_ops, "SPLIT", 128)  # several splits at interpreter-sized lengths
    lens = [1, 70, 200]
    full = full_prefill(make_world(lens, 8, 2, 64, 16, dtype=dtype, seed=5, device=DEVICE), tri)
    picks = [(s, t) for s, n in enumerate(lens) for t in sorted({0, n // 2, n - 1})]
    for bs in (64, 128):
        world = make_world(lens, 8, 2, 64, bs, dtype=dtype, seed=5, device=DEVICE, stale=float("nan"))
        assert_same_bits(torch.cat(full_prefill(world, tri)), torch.cat(full), f"prefill, page {bs}")
        for parallel in (False, True):
            outs = run(world, [(s, t + 1, 1) for s, t in picks], tri, parallel_splits=parallel)
            for (s, t), out in zip(picks, outs):
                assert_same_bits(out, full[s][t:t + 1], f"decode seq {s} at {t}, page {bs}, parallel {parallel}")
    monkeypatch.setattr(triton_ops, "SPLIT", 64)
    assert not mismatch(torch.cat(full_prefill(world, tri)), torch.cat(full)).same


def test_parallel_splits_merge_equals_sequential_fold_for_prefill_chunks(monkeypatch):
    monkeypatch.setattr(triton_ops, "SPLIT", 128)  # several splits at interpreter-sized lengths
    world = make_world([300, 270], 8, 2, 64, 16, seed=3, device=DEVICE)
    reqs = [(0, 300, 40), (1, 270, 17)]
    folded = run(world, reqs, tri, parallel_splits=False)
    merged = run(world, reqs, tri, parallel_splits=True)
    for a, b in zip(folded, merged):
        assert_same_bits(b, a, "parallel splits + merge vs sequential fold")


def test_a_mixed_batch_gives_its_leading_decodes_their_own_launch(monkeypatch):
    """A mixed batch's leading one-token sequences run as a decode-tile launch beside the prefill launch (two launches
    seen): the same bits as one prefill-tile launch, with splits in parallel and folded."""
    monkeypatch.setattr(triton_ops, "SPLIT", 128)
    # fp32, so that the control's other fold order shows in the outputs (bf16 can round it away on a few rows).
    world = make_world([300, 70, 200, 90], 8, 2, 64, 16, dtype=torch.float32, seed=17, device=DEVICE)
    reqs = [(0, 300, 1), (1, 64, 1), (2, 129, 1), (3, 90, 90), (2, 200, 40), (1, 70, 1)]
    launches = []
    launch = triton_ops._launch
    monkeypatch.setattr(triton_ops, "_launch", lambda q, k, v, meta, *a: launches.append(
        (meta.num_seqs, int(meta.cu_seqlens_q[0]), meta.max_query_len)) or launch(q, k, v, meta, *a))
    for parallel in (None, False, True):
        one = run(world, reqs, tri, parallel_splits=parallel, split_decodes=False)
        launches.clear()
        for a, b in zip(run(world, reqs, tri, parallel_splits=parallel, split_decodes=True), one):
            assert_same_bits(a, b, f"decode launch + prefill launch vs one launch, parallel splits {parallel}")
        # (sequences, first token, longest query) of each launch: the 3 decodes, then the rest from token 3.
        assert launches == [(3, 0, 1), (3, 3, 90)], f"the launches were {launches}"
    # Negative control: the same comparison sees another fold order (64-token splits) in the decode launch.
    one = torch.cat(run(world, reqs, tri, split_decodes=False))
    monkeypatch.setattr(triton_ops, "SPLIT", 64)
    assert mismatch(torch.cat(run(world, reqs, tri, split_decodes=True)), one).differing > 0, "the control changed no bit"


def test_the_fused_merge_equals_the_merge_kernel(monkeypatch):
    """Decode launches with splits in parallel merge in their last program (FUSED_MERGE): the merge kernel's bits,
    with every counter back at 0 after the launch. Negative controls: another fold order (64-token splits) is seen,
    and counters that do not start at 0 are left nonzero (a program merged before the last one arrived)."""
    monkeypatch.setattr(triton_ops, "SPLIT", 128)
    world = make_world([300, 70, 260], 8, 2, 64, 16, dtype=torch.float32, seed=23, device=DEVICE)
    reqs = [(0, 300, 1), (1, 70, 1), (2, 260, 1), (0, 129, 1)]
    counters = triton_ops._counters(torch.device(DEVICE), 1)
    monkeypatch.setattr(triton_ops, "FUSED_MERGE", False)
    kernel = torch.cat(run(world, reqs, tri, parallel_splits=True))
    monkeypatch.setattr(triton_ops, "FUSED_MERGE", True)
    for _ in range(2):  # the second launch starts from the counters the first left
        assert_same_bits(torch.cat(run(world, reqs, tri, parallel_splits=True)), kernel, "fused vs kernel merge")
        assert int(counters.count_nonzero()) == 0, "a counter was left nonzero"
    counters[:8] = 2  # 3 splits: the first program to arrive sees 2 and merges
    with warnings.catch_warnings():  # it merges partials no program has written yet: numpy may see NaN there
        warnings.simplefilter("ignore", RuntimeWarning)
        run(world, reqs, tri, parallel_splits=True)
    assert int(counters.count_nonzero()) > 0, "the control left no counter nonzero"
    counters.zero_()
    monkeypatch.setattr(triton_ops, "SPLIT", 64)
    assert mismatch(torch.cat(run(world, reqs, tri, parallel_splits=True)), kernel).differing > 0, \
        "the control changed no bit"


def test_a_grid_sized_for_a_longer_context_gives_the_same_bits(monkeypatch):
    """A CUDA graph's grid covers more splits than its rows reach (engine/cuda_graphs.py grid_len): the programs
    past a row's last split store nothing, and the bits are the folded launch's."""
    monkeypatch.setattr(triton_ops, "SPLIT", 128)
    world = make_world([300, 70], 8, 2, 64, 16, dtype=torch.float32, seed=19, device=DEVICE)  # as above
    reqs = [(0, 300, 1), (1, 70, 1), (0, 129, 1), (0, 128, 1)]

    def wide(q, k, v, meta, scale):
        return tri(q, k, v, dataclasses.replace(meta, max_context_len=1000), scale, parallel_splits=True)

    folded = run(world, reqs, tri, parallel_splits=False)
    for a, b in zip(run(world, reqs, wide), folded):
        assert_same_bits(a, b, "an 8-split grid vs the folded launch")
    # Negative control: the same comparison sees another fold order (64-token splits) in the wide grid.
    monkeypatch.setattr(triton_ops, "SPLIT", 64)
    assert mismatch(torch.cat(run(world, reqs, wide)), torch.cat(folded)).differing > 0, "the control changed no bit"


def test_the_split_policy_folds_many_programs_of_short_contexts():
    """Splits run in parallel for decode-shaped batches, except from FOLD_PROGRAMS (sequence, KV head) programs up to
    FOLD_SPLITS splits; never for prefill tiles or one split."""
    from types import SimpleNamespace

    s, n = triton_ops.SPLIT, triton_ops.FOLD_PROGRAMS // 8

    def parallel(seqs, ctx, query=1, tokens_per_tile=4):
        meta = SimpleNamespace(max_query_len=query, max_context_len=ctx, num_seqs=seqs)
        return triton_ops.default_parallel_splits(meta, tokens_per_tile, 8)

    assert [parallel(1, 2 * s), parallel(n - 1, 2 * s), parallel(n, 2 * s), parallel(n, 2 * s + 1)] == \
        [True, True, False, True]
    assert not parallel(1, s) and not parallel(1, 2 * s, query=5)


@pytest.mark.parametrize("dtype,bound", [(torch.float32, 2e-6), (torch.bfloat16, 6e-3), (torch.float16, 1e-3)])
def test_triton_close_to_float64(dtype, bound):
    world = make_world([1, 70, 280], 4, 2, 64, 16, dtype=dtype, seed=5, device=DEVICE)
    reqs = [(0, 1, 1), (1, 70, 70), (2, 280, 30)]
    out = torch.cat(run(world, reqs, tri))
    ref = torch.cat(run(world, reqs, paged_attention_reference))
    assert torch.isfinite(out).all()
    rel = float((out.double() - ref).norm() / ref.norm())
    assert rel < bound, f"{dtype}: relative error {rel:.2e} over {bound:.0e}"


def test_the_cuda_rows_attend_through_the_triton_kernel():
    """Both CUDA rows of the table run this kernel (fast mode too, at the head dims it has tiles for); their ops, run
    here on the interpreter, equal the launcher's bits."""
    from samebits.kernels.triton import backend, fast

    assert get_ops("deterministic", "cuda").backend is backend and get_ops("fast", "cuda").backend is fast
    world = make_world([20, 9], 4, 2, 64, 16, seed=7, device=DEVICE)
    direct = run(world, [(0, 20, 20), (1, 9, 3)], tri)
    for op in (backend.attention, fast.attention):
        for a, b in zip(run(world, [(0, 20, 20), (1, 9, 3)], op), direct):
            assert_same_bits(a, b, f"{op.__module__}.attention vs the triton launcher")


def test_split_boundaries_with_a_small_split(monkeypatch):
    """Many splits on tiny shapes (the configured split may exceed every length the interpreter can afford)."""
    monkeypatch.setattr(triton_ops, "SPLIT", 64)
    world = make_world([200, 9], 8, 2, 64, 16, seed=31, device=DEVICE)
    full = full_prefill(world, tri)
    assert_same_bits(torch.cat(run(world, [(0, 90, 90), (0, 200, 110)], tri)), full[0], "chunked at 90")
    for parallel in (False, True):
        outs = run(world, [(0, t + 1, 1) for t in (0, 63, 64, 127, 128, 150, 199)], tri, parallel_splits=parallel)
        for t, out in zip((0, 63, 64, 127, 128, 150, 199), outs):
            assert_same_bits(out, full[0][t:t + 1], f"decode at {t}, split 64, parallel {parallel}")
