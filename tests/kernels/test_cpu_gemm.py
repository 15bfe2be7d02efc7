"""The proven CPU GEMM route (samebits/kernels/cpu/gemm.py): what its self-test admits, what it refuses, and that
every admitted block size gives a row the canonical block's bits. Negative controls swap the vendor call for
deliberately variant ones and check the proof sees each kind of variance."""
import pytest
import torch

from samebits.kernels.cpu import gemm, mkl
from samebits.probe.compare import assert_same_bits
from tests.kernels.helpers import fresh_generator, rand

SHAPES = [(576, 960), (64, 128), (1536, 576), (257, 33), (33, 2)]  # (K, N): model shapes, a K tail, N < MIN_N


@pytest.fixture
def fresh_verdicts(monkeypatch):
    """Proofs run again in the test (and the process's own verdicts and thread pin are untouched by it)."""
    monkeypatch.setattr(gemm, "_VERDICTS", {})
    monkeypatch.setattr(gemm, "_PINNED_THREADS", [])


@pytest.mark.parametrize("k,n", SHAPES)
def test_every_row_count_gives_the_canonical_bits(k, n, seed):
    g = fresh_generator(seed)
    w = rand((n, k), torch.float32, g)
    x = rand((gemm.CANONICAL, k), torch.float32, g)
    canonical = gemm.run_blocks(x, gemm._pad_n(w), [gemm.CANONICAL])[:, :n]
    for m in [1, 2, 3, 5, 17, 40, 63, 64, 65, 200, 300]:
        batch = rand((m, k), torch.float32, g)
        p = int(torch.randint(0, m, (1,), generator=g))
        batch[p] = x[5]
        assert_same_bits(gemm.blocked_gemm(batch, w)[p, :n], canonical[5], f"K={k} N={n}: row at {p} of M={m}")


def test_machine_admits_the_canonical_block_at_model_shapes():
    for k, n in [(576, 960), (576, 3072), (1536, 576)]:
        v = gemm.verdict(k, n)
        assert gemm.CANONICAL in v.rows and not v.failure


def test_pick_rows_covers_m_with_few_padding_rows():
    sizes = tuple(gemm.BLOCK_ROWS)
    for m in range(1, 600):
        blocks = gemm.pick_rows(m, sizes)
        assert sum(blocks) >= m and sum(blocks) - m < 16, (m, blocks)
    assert gemm.pick_rows(1, (64, 256)) == [64]  # only what was admitted is used


def _perturbed(condition):
    """A vendor call whose result moves by one ulp wherever condition(a, row index in block) holds."""
    real = gemm.block_gemm

    def call(a, b, out):
        real(a, b, out)
        rows = torch.arange(a.shape[-2])
        hit = condition(a, rows)
        if hit.any():
            out[..., hit, :] = torch.nextafter(out[..., hit, :], torch.tensor(float("inf")))
        return out

    return call


def test_negative_control_block_size_dependent_vendor_is_not_admitted(monkeypatch, fresh_verdicts):
    # A size-16 block computes other bits: the proof drops 16 and the route never uses it.
    monkeypatch.setattr(gemm, "block_gemm", _perturbed(lambda a, rows: torch.full_like(rows, a.shape[-2] == 16,
                                                                                    dtype=torch.bool)))
    v = gemm.verdict(96, 64)
    assert 16 not in v.rows and gemm.CANONICAL in v.rows
    assert all(16 not in gemm.pick_rows(m, v.rows) for m in range(1, 300))


def test_negative_control_position_dependent_vendor_is_refused(monkeypatch, fresh_verdicts):
    # Row 3 of every block gets other bits: no block size can be trusted, deterministic mode refuses loudly.
    monkeypatch.setattr(gemm, "block_gemm", _perturbed(lambda a, rows: rows == 3))
    with pytest.raises(gemm.CpuRouteUnproven, match=r"K=96, N=64.*moved.*MKL_CBWR=AVX2,STRICT"):
        gemm.blocked_gemm(torch.ones(5, 96), torch.ones(64, 96))


def test_negative_control_run_to_run_variant_vendor_is_refused(monkeypatch, fresh_verdicts):
    # Like an autotuner: other bits once it has seen the first blocks (the proof's reference takes four).
    calls = []
    monkeypatch.setattr(gemm, "block_gemm", _perturbed(lambda a, rows: torch.full_like(
        rows, calls.append(1) or len(calls) > max(gemm.BLOCK_ROWS) // gemm.CANONICAL, dtype=torch.bool)))
    with pytest.raises(gemm.CpuRouteUnproven, match="two runs"):
        gemm.verdict(96, 64)


@pytest.mark.skipif(not mkl.available(), reason="needs MKL's per-thread thread count")
def test_negative_control_thread_dependent_vendor_pins_the_count(monkeypatch, fresh_verdicts):
    monkeypatch.setattr(gemm, "block_gemm", _perturbed(lambda a, rows: torch.full_like(
        rows, mkl.threads() == 1, dtype=torch.bool)))
    monkeypatch.setattr(gemm, "current_threads", lambda: 4)
    v = gemm.verdict(96, 64)
    assert not v.thread_independent and v.rows
    assert gemm._PINNED_THREADS == [4]
    monkeypatch.setattr(gemm, "current_threads", lambda: 3)
    with pytest.raises(gemm.CpuRouteUnproven, match="computed at 4 threads; now 3"):
        gemm.verdict(96, 64)


@pytest.mark.skipif(not mkl.available(), reason="needs MKL's per-thread thread count")
def test_bits_do_not_change_with_the_thread_count(seed):
    g = fresh_generator(seed)
    w, x = rand((960, 576), torch.float32, g), rand((37, 576), torch.float32, g)
    if not gemm.verdict(576, 960).thread_independent:
        pytest.skip("MKL's bits follow the thread count on this machine (the route pins it instead)")
    with mkl.local_threads(1):
        single = gemm.blocked_gemm(x, w)
    assert_same_bits(gemm.blocked_gemm(x, w), single, "1 MKL thread vs the process's count")


def test_verdicts_are_shown_for_the_fingerprint():
    gemm.verdict(576, 960)
    shown = gemm.verdicts()
    name = next(k for k in shown if k.startswith("K=576 N=960"))
    assert "rows" in shown[name] and "64" in shown[name]


def test_known_answer_is_stable():
    assert gemm.known_answer() == gemm.known_answer()
    assert len(gemm.known_answer()) == 16


def test_entry_gemm_gives_each_entry_its_canonical_bits(seed):
    g = fresh_generator(seed)
    for e, rows, k, n in [(3, 3, 64, 128), (48, 3, 128, 80), (6, 64, 64, 128), (5, 13, 33, 20)]:
        r = gemm.block_for([(k, n)], rows, gemm.BLOCK_ROWS)  # entry_gemm's contract: an admitted block size
        a, b = rand((e, r, k), torch.float32, g), rand((e, n, k), torch.float32, g)
        got = gemm.entry_gemm(a, b, a.new_empty(e, r, n))
        for i in range(e):
            x = torch.zeros(gemm.CANONICAL, k)
            x[:r] = a[i]
            assert_same_bits(got[i], gemm.run_blocks(x, b[i], [gemm.CANONICAL])[:r], f"entry {i} of {e}, r={r}")


def test_negative_control_batch_count_dependent_bmm_falls_back_to_one_mm_per_entry(monkeypatch, fresh_verdicts, seed):
    # A bmm whose bits change once it holds more than 4 entries: the proof refuses it, entries get torch.mm each.
    monkeypatch.setattr(gemm, "_BATCHED", {})
    real = gemm._bmm

    def variant(a, b, out):
        real(a, b, out)
        if a.shape[0] > 4:
            out.copy_(torch.nextafter(out, torch.tensor(float("inf"))))
        return out

    monkeypatch.setattr(gemm, "_bmm", variant)
    assert gemm.batched_rows(4, 64, 128) and gemm.batched_rows(8, 64, 128) == ()
    g = fresh_generator(seed)
    a, b = rand((8, 4, 64), torch.float32, g), rand((8, 128, 64), torch.float32, g)
    got = gemm.entry_gemm(a, b, a.new_empty(8, 4, 128))
    assert_same_bits(got, torch.stack([a[i] @ b[i].t() for i in range(8)]), "fallback vs torch.mm per entry")
    assert "torch.mm per entry" in gemm.verdicts()["bmm B=8 K=64 N=128 t" + str(gemm.current_threads())]
