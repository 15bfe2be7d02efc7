"""The Gluon decode tile (kernels/triton/attention_gluon.py) gives attention.py's bits: decode at every position equals
the Triton prefill of the whole sequence, with splits folded and in parallel (fused merge and merge kernel), 1-4 new
tokens per sequence, pages of 64 and 128 tokens whose unused slots hold NaN; attention.paged_attention takes it for
few programs. Hopper only."""
from __future__ import annotations

import contextlib
import dataclasses
import random

import pytest
import torch

from samebits.probe.compare import assert_same_bits, mismatch
from tests.kernels.test_attention import full_prefill, make_world, run

pytestmark = pytest.mark.gpu
if not (torch.cuda.is_available() and torch.cuda.get_device_capability()[0] == 9):
    pytest.skip("the Gluon decode tile is Hopper's (wgmma, TMA)", allow_module_level=True)
ag = pytest.importorskip("samebits.kernels.triton.attention_gluon")
from samebits.kernels.triton import attention as at

SEED = 7
CASES = [(128, 32, 8, torch.bfloat16, 64), (64, 16, 4, torch.bfloat16, 128), (128, 8, 1, torch.float16, 64)]
LENS = [1, 2, 63, 64, 65, 1023, 1024, 1025, 2047, 2100, 3000]


@pytest.fixture(autouse=True)
def triton_reference(monkeypatch):
    """attention.paged_attention as the reference runs attention.py's own kernel, never the Gluon tile."""
    monkeypatch.setattr(at, "GLUON_PROGRAMS", 0)


@contextlib.contextmanager
def switches(gluon_programs: int, fused_merge: bool = True):
    saved = at.GLUON_PROGRAMS, at.FUSED_MERGE
    at.GLUON_PROGRAMS, at.FUSED_MERGE = gluon_programs, fused_merge
    try:
        yield
    finally:
        at.GLUON_PROGRAMS, at.FUSED_MERGE = saved


def gluon(q, k_cache, v_cache, meta, scale, parallel_splits=None, fused_merge=True):
    """attention.paged_attention with the launch in the Gluon tile, whatever its program count (asserted)."""
    g = q.shape[1] // k_cache.shape[2]
    rows = at.tile_rows(meta.max_query_len, g)
    if parallel_splits is None:
        parallel_splits = at.default_parallel_splits(meta, rows // g, k_cache.shape[2])
    with switches(1 << 30, fused_merge):
        assert at._gluon_decode(q, k_cache, meta, rows, parallel_splits), "not a Gluon decode launch"
        return at.paged_attention(q, k_cache, v_cache, meta, scale, parallel_splits=parallel_splits)


def triton(q, k_cache, v_cache, meta, scale, parallel_splits=None):
    return at.paged_attention(q, k_cache, v_cache, meta, scale, parallel_splits=parallel_splits)


@pytest.mark.parametrize("d,hq,hkv,dtype,page", CASES)
@pytest.mark.parametrize("parallel", [None, False, True])
def test_decode_at_every_position_equals_the_triton_prefill(d, hq, hkv, dtype, page, parallel):
    world = make_world(LENS, hq, hkv, d, page, dtype=dtype, seed=SEED, device="cuda", stale=float("nan"))
    full = full_prefill(world, triton)
    s = len(LENS) - 1
    positions = list(range(LENS[s]))
    for lo in range(0, len(positions), 256):
        chunk = positions[lo:lo + 256]
        outs = run(world, [(s, t + 1, 1) for t in chunk], gluon, parallel_splits=parallel)
        for t, out in zip(chunk, outs):
            assert_same_bits(out, full[s][t:t + 1], f"decode at {t}, parallel {parallel}")
    outs = run(world, [(i, n, 1) for i, n in enumerate(LENS)], gluon, parallel_splits=parallel)
    for i, out in enumerate(outs):
        assert_same_bits(out, full[i][-1:], f"seq {i} (len {LENS[i]}) in a batch of all")


@pytest.mark.parametrize("d,hq,hkv,dtype,page", CASES[:2])
def test_several_new_tokens_per_tile_equal_the_triton_prefill(d, hq, hkv, dtype, page):
    world = make_world(LENS, hq, hkv, d, page, dtype=dtype, seed=SEED + 1, device="cuda", stale=float("nan"))
    full = full_prefill(world, triton)
    rng = random.Random(SEED)
    max_new = at.DECODE_ROWS // (hq // hkv)
    reqs = [(i, n, rng.randint(1, min(n, max_new))) for i, n in enumerate(LENS)]
    for parallel, fused in ((None, True), (True, True), (True, False)):
        outs = run(world, reqs, gluon, parallel_splits=parallel, fused_merge=fused)
        for (i, n, k), out in zip(reqs, outs):
            assert_same_bits(out, full[i][n - k:n], f"seq {i}: {k} new of {n}, parallel {parallel}, fused {fused}")


def test_negative_control_another_scale_is_caught():
    d, hq, hkv, dtype, page = CASES[0]
    world = make_world(LENS, hq, hkv, d, page, dtype=dtype, seed=SEED, device="cuda")
    reqs = [(i, n, 1) for i, n in enumerate(LENS)]
    want = run(world, reqs, triton)
    world = dataclasses.replace(world, scale=world.scale * (1 + 2 ** -10))
    got = run(world, reqs, gluon)
    assert not all(mismatch(g, w).same for g, w in zip(got, want)), "a changed scale went unnoticed"


def test_paged_attention_takes_the_gluon_tile_for_few_programs(monkeypatch):
    d, hq, hkv, dtype, page = CASES[0]
    world = make_world(LENS, hq, hkv, d, page, dtype=dtype, seed=SEED + 2, device="cuda", stale=float("nan"))
    reqs = [(len(LENS) - 1, LENS[-1], 1)]  # one sequence: 8 KV heads x 3 splits
    calls = []
    decode = ag.decode
    monkeypatch.setattr(ag, "decode", lambda *a, **kw: calls.append(a) or decode(*a, **kw))
    want = run(world, reqs, triton)
    assert not calls, "GLUON_PROGRAMS = 0 still took the Gluon tile"
    monkeypatch.setattr(at, "GLUON_PROGRAMS", 64)
    got = run(world, reqs, triton)
    assert len(calls) == 1, "24 programs did not take the Gluon tile"
    assert_same_bits(got[0], want[0], "paged_attention through the Gluon tile")
