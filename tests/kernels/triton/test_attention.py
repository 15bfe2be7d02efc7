"""The Triton paged attention and split merge on small shapes: under TRITON_INTERPRET=1 on a CPU machine, natively on
a GPU. The same invariants as the CPU path, bit for bit."""
from __future__ import annotations

import random

import pytest
import torch

from samebits.diagnostics.compare import assert_same_bits, mismatch
from samebits.kernels import get_ops
from samebits.kernels.attention import paged_attention_reference
from tests.kernels.test_attention import full_prefill, make_world, random_cuts, run

pytestmark = pytest.mark.interpreter
triton_ops = pytest.importorskip("samebits.kernels.triton.attention")
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def tri(q, k_cache, v_cache, meta, scale, parallel_splits=None, ahead=None):
    return triton_ops.paged_attention(q, k_cache, v_cache, meta, scale, parallel_splits=parallel_splits, ahead=ahead)


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


def test_parallel_splits_merge_equals_sequential_fold_for_prefill_chunks(monkeypatch):
    monkeypatch.setattr(triton_ops, "SPLIT", 128)  # several splits at interpreter-sized lengths
    world = make_world([300, 270], 8, 2, 64, 16, seed=3, device=DEVICE)
    reqs = [(0, 300, 40), (1, 270, 17)]
    folded = run(world, reqs, tri, parallel_splits=False)
    merged = run(world, reqs, tri, parallel_splits=True)
    for a, b in zip(folded, merged):
        assert_same_bits(b, a, "parallel splits + merge vs sequential fold")


def test_block_ids_ahead_loop_equals_the_plain_loop(monkeypatch):
    """Decode tiles load block ids a tile ahead, prefill tiles in the tile's own iteration: forcing either loop on
    prefill, chunks and decode (split in parallel and folded) gives the same bits."""
    monkeypatch.setattr(triton_ops, "SPLIT", 128)
    world = make_world([300, 70], 8, 2, 64, 16, seed=13, device=DEVICE)
    for reqs in ([(0, 300, 300), (1, 70, 70)], [(0, 300, 45), (1, 70, 1)], [(0, 129, 1), (0, 300, 1), (1, 64, 1)]):
        for parallel in (False, True):
            plain = run(world, reqs, tri, parallel_splits=parallel, ahead=False)
            for a, b in zip(run(world, reqs, tri, parallel_splits=parallel, ahead=True), plain):
                assert_same_bits(a, b, f"ahead vs plain loop, {reqs}, parallel splits {parallel}")
    # Negative control: the same comparison sees another fold order (64-token splits) on the ahead loop.
    reqs = [(0, 300, 300)]
    plain = run(world, reqs, tri, ahead=False)[0]
    monkeypatch.setattr(triton_ops, "SPLIT", 64)
    assert mismatch(run(world, reqs, tri, ahead=True)[0], plain).differing > 0, "the control changed no bit"


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
