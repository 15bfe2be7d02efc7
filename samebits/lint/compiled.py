"""Compiled kernels (SB4xx): PTX text, SASS dumps, kernel-name lists, cubins through cuobjdump/nvdisasm when present,
and Triton kernels compiled to PTX for sm_90 on the spot. Lexical: line regexes on the disassembly.

Generated code carries no review comments, so compiled findings cannot be suppressed; state the guarantee at the source.
"""
from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

from samebits.lint.findings import Finding
from samebits.lint.names import PTX_FLOAT_ATOMIC, SASS_FLOAT_ATOMIC, SPLIT_K_KERNEL

_COMMENT = re.compile(r"//[^\n]*|/\*.*?\*/", re.DOTALL)
_PTX_ENTRY = re.compile(r"\.entry\s+([\w$.]+)")
_SASS_FUNCTION = re.compile(r"Function\s*:\s*([\w$.]+)")
_NAME_COMMENT = re.compile(r"(^|\s)#.*")  # in a name list; `{lambda(float)#1}` in a demangled name is no comment
DISASSEMBLERS = (("cuobjdump", "-sass"), ("nvdisasm", "-c"))


def check_text(path: str, text: str) -> list[Finding]:
    """Float atomics and split-K kernels in PTX or SASS; a file of neither is read as one kernel name per line
    (as a profiler lists them)."""
    lines = _strip_comments(text).splitlines()
    is_asm = any(_PTX_ENTRY.search(ln) or _SASS_FUNCTION.search(ln) or ".version" in ln for ln in lines)
    out = []
    for no, line in enumerate(lines, 1):
        for m in PTX_FLOAT_ATOMIC.finditer(line):
            out.append(Finding(path, no, m.start() + 1, "SB401", f"float atomic `{m.group()}`"))
        for m in SASS_FLOAT_ATOMIC.finditer(line):
            out.append(Finding(path, no, m.start() + 1, "SB402", f"float atomic `{m.group()}`"))
        name = _kernel_name(line, is_asm)
        if name and SPLIT_K_KERNEL.search(name):
            out.append(Finding(path, no, 1, "SB403", f"split-K kernel `{name}`"))
    return out


def _strip_comments(text: str) -> str:
    return _COMMENT.sub(lambda m: "\n" * m.group().count("\n"), text)


def _kernel_name(line: str, is_asm: bool) -> str | None:
    m = _PTX_ENTRY.search(line) or _SASS_FUNCTION.search(line)
    if m:
        return m.group(1)
    return None if is_asm else _NAME_COMMENT.sub("", line).strip() or None


def disassemble(path: Path) -> tuple[str | None, str]:
    """(SASS text, '') from the first disassembler found, or (None, why not)."""
    for tool, flag in DISASSEMBLERS:
        exe = shutil.which(tool)
        if exe:
            out = subprocess.run([exe, flag, str(path)], capture_output=True, text=True, timeout=300, check=False)
            if out.returncode == 0:
                return out.stdout, ""
            return None, f"{tool} failed: {out.stderr.strip()[-300:]}"
    return None, "neither cuobjdump nor nvdisasm is on PATH (install the CUDA toolkit to check cubins)"


def check_file(path: Path) -> tuple[list[Finding], list[str]]:
    """Findings and notes (a note says a file could not be checked, and why)."""
    data = path.read_bytes()
    if not data.startswith(b"\x7fELF"):
        return check_text(str(path), data.decode("utf-8", "replace")), []
    sass, why = disassemble(path)
    if sass is None:
        return [], [f"skipped {path}: {why}"]
    return check_text(str(path), sass), []


def triton_ptx(spec: str, timeout: int = 600) -> tuple[str | None, str]:
    """(PTX, '') for a Triton kernel spec compiled for sm_90 in a subprocess, or (None, why not)."""
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-m", "samebits.lint.triton_compile", spec], env=env,
                         capture_output=True, text=True, timeout=timeout, check=False)
    if out.returncode != 0:
        return None, out.stderr.strip().splitlines()[-1] if out.stderr.strip() else f"exit {out.returncode}"
    return out.stdout, ""


def check_triton(spec: str) -> list[Finding]:
    """Findings in the kernel's sm_90 PTX; ValueError with the compiler's one-line reason when it does not compile."""
    ptx, why = triton_ptx(spec)
    if ptx is None:
        raise ValueError(f"could not compile {spec}: {why}")
    return check_text(spec, ptx)
