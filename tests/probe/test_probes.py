"""The probe harness: report schema, the negative control, plot output."""
import json

import pytest
import torch

from samebits.probe.compare import mismatch
from samebits.probe.impls import Impl, VendorOps
from samebits.probe.plot import write_plot
from samebits.probe.probes import PROBES, Ctx, Sizes, run_one, run_probes
from samebits.probe.report import VERDICTS, build_report, table
from samebits.probe.tiny_llama import LlamaShape

CPU = torch.device("cpu")
TINY = Sizes(matmul_k=64, matmul_n=32, matmul_m=(1, 2, 3, 8, 33), runs=4, run_matmul_m=4, sum_n=1 << 12,
             index_add_n=1 << 10, index_add_bins=7, attn_heads=2, attn_kv_heads=2, attn_dim=16, attn_ctx=20,
             attn_batches=(1, 2, 4), prefill_lens=(5, 17), norm_hidden=48, norm_rows=(1, 2, 5),
             model=LlamaShape(vocab=64, hidden=32, intermediate=64, layers=1, heads=2, kv_heads=1),
             prompts=3, prompts_alone=2, prompt_len=4, gen_tokens=3)


@pytest.fixture(scope="module")
def report():
    results = run_probes(CPU, TINY)
    return json.loads(json.dumps(build_report("cpu", {"hash": "x"}, results, False, 0.0)))


def test_report_top_level_schema(report):
    assert set(report) == {"schema", "device", "full", "elapsed_s", "fingerprint", "probes"}
    assert report["device"] == "cpu" and report["fingerprint"]["hash"] == "x"


def test_every_probe_reports_both_implementations(report):
    seen = {(p["name"], p["implementation"]) for p in report["probes"]}
    assert seen == {(name, impl) for name in PROBES for impl in ("vendor", "samebits")}


def test_probe_entry_schema(report):
    keys = {"name", "implementation", "dtype", "axis", "sizes", "mismatch_fraction", "max_abs_diff", "verdict",
            "note", "extra"}
    for p in report["probes"]:
        assert set(p) == keys
        assert p["verdict"] in VERDICTS
        assert len(p["sizes"]) == len(p["mismatch_fraction"]) == len(p["max_abs_diff"])
        assert all(0.0 <= f <= 1.0 for f in p["mismatch_fraction"])
        assert (p["verdict"] in ("n/a", "error")) == (not p["sizes"]), p
        assert p["sizes"] or p["note"], "an empty cell must say why"


def test_nothing_errors_on_the_cpu(report):
    assert [p for p in report["probes"] if p["verdict"] == "error"] == []


def test_verdict_follows_the_numbers(report):
    for p in report["probes"]:
        if p["sizes"]:
            assert (p["verdict"] == "variant") == any(f > 0 for f in p["mismatch_fraction"])


def test_measured_facts(report):
    by = {(p["name"], p["implementation"], p["dtype"]): p for p in report["probes"]}
    assoc = by["fp32_associativity", "vendor", "float32"]
    assert assoc["verdict"] == "variant" and (assoc["extra"]["left"], assoc["extra"]["right"]) == (1.0, 0.0)
    assert by["run_to_run_splitk_atomic", "vendor", "bfloat16"]["note"] == "needs CUDA"
    model = by["model_greedy", "vendor", "float32"]["extra"]
    assert model["sequences"] == 2 and 0 < model["logit_rows_compared"] <= 2 * 3


def test_table_has_a_row_per_probe_and_dtype(report):
    rows = {(p["name"], p["dtype"]) for p in report["probes"]}
    assert table(report).row_count == len(rows)


def test_plot_is_a_png_with_the_batch_sweeps(report, tmp_path):
    path = tmp_path / "probe.png"
    lines = write_plot(report, path)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    measured = [p for p in report["probes"] if p["axis"] == "batch" and p["sizes"]]
    assert lines == len(measured) > 0


def test_run_is_reproducible(report):
    again = [r.as_dict() for r in run_probes(CPU, TINY, [PROBES["matmul_batch"], PROBES["model_greedy"]])]
    first = [p for p in report["probes"] if p["name"] in ("matmul_batch", "model_greedy")]
    assert again == first


def test_mismatch_counts_signed_zero_and_nan():
    a = torch.tensor([0.0, float("nan"), 1.0])
    b = torch.tensor([-0.0, float("nan"), 1.0])
    assert mismatch(a, b).differing == 1


class Broken(VendorOps):
    def __init__(self, exc):
        super().__init__(CPU)
        self.exc = exc

    def linear(self, x, w, bias=None):
        raise self.exc


def test_a_crashing_cell_is_reported_not_raised():
    (r, _) = run_one(PROBES["matmul_batch"], Impl("samebits", Broken(ZeroDivisionError("tile"))), Ctx(CPU, TINY))
    assert r.verdict == "error" and r.note == "ZeroDivisionError: tile" and r.sizes == []


def test_a_kernel_refusal_is_not_applicable():
    from samebits.kernels.common import UnsupportedOpError

    (r, _) = run_one(PROBES["matmul_batch"], Impl("samebits", Broken(UnsupportedOpError("no fp64"))), Ctx(CPU, TINY))
    assert r.verdict == "n/a" and r.note == "unsupported: no fp64"
