"""The compiled check on real output: PTX/SASS atomics by type, and the kernel names an H200 ran for our probes' ops."""
from pathlib import Path

from samebits.lint.compiled import check_file, check_text

H200_NAMES = Path(__file__).resolve().parents[2] / "docs" / "results" / "lint.h200_vendor_kernels.txt"


def rules(text):
    return [(f.line, f.rule) for f in check_text("k", text)]


def test_float_atomics_by_type_integer_ones_are_not_findings():
    ptx = ".version 8.4\n.visible .entry k(\n atom.global.add.u32 %r1, [%rd1], 1;\n red.global.add.f32 [%rd1], %f1;\n"
    assert rules(ptx) == [(4, "SB401")]
    sass = "Function : k\n RED.E.ADD.STRONG.GPU [R2.64], R5 ;\n RED.E.ADD.F32.FTZ.RN.STRONG.GPU [R2.64], R5 ;\n"
    assert rules(sass) == [(3, "SB402")]


def test_ptx_comments_are_not_code():
    assert rules(".version 8.4\n// red.global.add.f32 [%rd1], %f1;\n/* atom.add.f16 */\n") == []


def test_the_split_k_kernels_cublas_ran_on_the_h200_are_named():
    # torch 2.11 + CUDA 13 on an H200: F.linear at M = 1..4096, SDPA, norms, sums, index_add_, multinomial.
    found, notes = check_file(H200_NAMES)
    names = H200_NAMES.read_text().splitlines()
    flagged = sorted(names[f.line - 1].split("<")[0] for f in found)
    assert not notes and {f.rule for f in found} == {"SB403"}
    assert len(flagged) == 8
    assert sum("nvjet_sm90" in n and "splitK" in n for n in flagged) == 3
    assert sum("execute_split_k_kernel" in n for n in flagged) == 4
    assert "void cublasLt::splitKreduce_kernel" in flagged
    assert not any("splitK" in n or "split_k" in n for i, n in enumerate(names, 1) if i not in {f.line for f in found})
