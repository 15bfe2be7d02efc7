"""The entry points end to end: run() (what `samebits lint` calls) and `python -m samebits.lint`."""
import io
import subprocess
import sys
from pathlib import Path

import pytest

from samebits.lint import compiled
from samebits.lint.cli import iter_sources, run
from samebits.lint.report import from_json
from samebits.lint.rules import markdown_table

ROOT = Path(__file__).resolve().parents[2]
CORPUS = Path(__file__).parent / "lint_corpus"
KERNELS = Path(__file__).with_name("lint_triton_kernels.py")


def lint(*args, **kw):
    out, err = io.StringIO(), io.StringIO()
    code = run(*args, out=out, err=err, **kw)
    return code, out.getvalue(), err.getvalue()


def test_exit_codes():
    assert lint([CORPUS / "SB101_pos.cu"])[0] == 1
    assert lint([CORPUS / "SB101_neg.cu", CORPUS / "SB301_neg.py"])[0] == 0
    code, _, err = lint([CORPUS / "missing.py"])
    assert code == 2 and "no such file" in err
    assert lint([CORPUS], fmt="xml")[0] == 2
    assert lint([])[0] == 2
    code, _, err = lint([CORPUS / "SB401_pos.ptx"])
    assert code == 2 and "--compiled" in err


def test_directories_are_walked_for_sources_only(tmp_path):
    (tmp_path / "__pycache__").mkdir()
    for name in ("a.py", "b.cu", "c.cuh", "d.txt", "__pycache__/e.py"):
        (tmp_path / name).write_text("")
    assert [p.name for p in iter_sources([tmp_path])] == ["a.py", "b.cu", "c.cuh"]


def test_invalid_python_is_a_note_not_a_crash(tmp_path):
    (tmp_path / "bad.py").write_text("def (:\n")
    code, _, err = lint([tmp_path])
    assert code == 0 and "skipped" in err and "not valid Python" in err


def test_module_entry_point_prints_json():
    out = subprocess.run([sys.executable, "-m", "samebits.lint", "--format", "json",
                          str(CORPUS / "SB301_pos.py")], cwd=ROOT, capture_output=True, text=True, check=False)
    assert out.returncode == 1, out.stderr
    assert {f.rule for f in from_json(out.stdout)} == {"SB301"}


def test_module_entry_point_prints_the_rule_table():
    out = subprocess.run([sys.executable, "-m", "samebits.lint", "--rules"], cwd=ROOT,
                         capture_output=True, text=True, check=False)
    assert out.returncode == 0 and out.stdout.strip() == markdown_table()


def test_compiled_ptx_and_name_lists():
    code, out, _ = lint([], compiled=[CORPUS / "SB401_pos.ptx", CORPUS / "SB403_pos.txt"], fmt="json")
    assert code == 1 and {f.rule for f in from_json(out)} == {"SB401", "SB403"}


def test_cubin_without_disassembler_is_skipped_with_a_note(tmp_path, monkeypatch):
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF\x02\x01\x01" + bytes(64))
    monkeypatch.setattr(compiled.shutil, "which", lambda _: None)
    code, _, err = lint([], compiled=[cubin])
    assert code == 0 and "skipped" in err and "cuobjdump" in err and "nvdisasm" in err


def test_cubin_goes_through_the_disassembler(tmp_path, monkeypatch):
    cubin = tmp_path / "k.cubin"
    cubin.write_bytes(b"\x7fELF" + bytes(16))
    fake = tmp_path / "cuobjdump"
    fake.write_text("#!/bin/sh\necho '        Function : k'\necho '  /*00b0*/  RED.E.ADD.F32.FTZ.RN.STRONG.GPU [R2.64], R5 ;'\n")
    fake.chmod(0o755)
    monkeypatch.setattr(compiled.shutil, "which", lambda tool: str(fake) if tool == "cuobjdump" else None)
    code, out, _ = lint([], compiled=[cubin], fmt="json")
    assert code == 1 and [(f.rule, f.line) for f in from_json(out)] == [("SB402", 2)]


def test_triton_kernels_compile_for_sm90_and_float_atomics_are_found():
    pytest.importorskip("triton")
    specs = [f"{KERNELS}:float_atomic_kernel(x_ptr=*fp32, out_ptr=*fp32, BLOCK=128, num_warps=4)",
             f"{KERNELS}:int_counter_kernel(count_ptr=*i32, x_ptr=*fp32, y_ptr=*fp32, BLOCK=128)"]
    code, out, _ = lint([], triton=specs, fmt="json")
    found = from_json(out)
    assert code == 1 and {f.rule for f in found} == {"SB401"}
    assert all(f.path == specs[0] for f in found), "the integer counter's atomic is not a finding"


def test_triton_spec_that_does_not_compile_is_a_usage_error():
    pytest.importorskip("triton")
    code, _, err = lint([], triton=[f"{KERNELS}:float_atomic_kernel(x_ptr=*fp32)"])
    assert code == 2 and "give a type or a value for out_ptr, BLOCK" in err
