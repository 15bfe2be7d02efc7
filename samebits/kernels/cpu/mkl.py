"""Intel MKL's process-wide numerics switches, read and set through the MKL that torch links (no MKL install needed).

- Conditional numerical reproducibility (CNR, `MKL_CBWR`): pins MKL to one code path ("branch") and, with STRICT, to
  results that do not depend on the thread count. It is read once, at MKL's first computation; after that a change is
  refused (MKL answers MODE_CHANGE_FAILURE), so the template pins it before the first matmul or says it came too late.
- Threads: MKL's own count (what a call will use), and a per-thread override, so a self-test can compute at one thread
  without touching the count other threads see.

torch links MKL statically into libtorch_cpu and exports MKL's service entry points (`mkl_serv_cbwr_get/set`,
`MKL_Set_Num_Threads_Local`, `mkl_get_max_threads`); on a build without them (OpenBLAS, another OS) every function here
answers None, and the callers treat the library's numerics as unpinned.
"""
from __future__ import annotations

import contextlib
import ctypes
import functools
import os

# mkl_cbwr.h: branch values and the STRICT bit.
BRANCHES = {1: "OFF", 2: "AUTO", 3: "COMPATIBLE", 4: "SSE2", 6: "SSSE3", 7: "SSE4_1", 8: "SSE4_2", 9: "AVX",
            10: "AVX2", 11: "AVX512_MIC", 12: "AVX512", 13: "AVX512_MIC_E1", 14: "AVX512_E1"}
STRICT = 0x10000
_ALL = -1
_SUCCESS, _UNSUPPORTED_BRANCH, _MODE_CHANGE_FAILURE = 0, -3, -8


@functools.lru_cache(maxsize=1)
def _lib():
    import torch

    path = os.path.join(os.path.dirname(torch.__file__), "lib", "libtorch_cpu.so")
    try:
        lib = ctypes.CDLL(path)
        for name in ("mkl_serv_cbwr_get", "mkl_serv_cbwr_set", "mkl_get_max_threads", "MKL_Set_Num_Threads_Local"):
            getattr(lib, name)
    except (OSError, AttributeError):
        return None
    lib.mkl_serv_cbwr_get.argtypes = [ctypes.c_int]
    lib.mkl_serv_cbwr_set.argtypes = [ctypes.c_int]
    lib.MKL_Set_Num_Threads_Local.argtypes = [ctypes.c_int]
    return lib


def available() -> bool:
    return _lib() is not None


def _describe(value: int) -> str:
    name = BRANCHES.get(value & 0xFFFF, f"branch {value & 0xFFFF}")
    return name + (",STRICT" if value & STRICT else "")


def _encode(setting: str) -> int:
    """'AVX2,STRICT' -> the mkl_cbwr.h integer (the MKL_CBWR environment variable's syntax)."""
    names = {v: k for k, v in BRANCHES.items()}
    parts = [p.strip().upper() for p in setting.split(",")]
    if parts[0] not in names or any(p != "STRICT" for p in parts[1:]):
        raise ValueError(f"MKL CNR setting {setting!r}: expected BRANCH or BRANCH,STRICT with BRANCH in "
                         f"{sorted(names)}")
    return names[parts[0]] | (STRICT if "STRICT" in parts[1:] else 0)


def cnr_mode() -> str | None:
    """MKL's CNR mode as MKL_CBWR spells it ('OFF', 'AVX2,STRICT', 'AUTO,STRICT', ...); None without MKL."""
    lib = _lib()
    return None if lib is None else _describe(lib.mkl_serv_cbwr_get(_ALL))


def pin_cnr(setting: str) -> bool:
    """Ask MKL for `setting` ('AVX2,STRICT'); True when MKL now runs it. Never raises.

    On CPUs where MKL refuses the branch (it refuses the Intel branches on AMD: measured on an EPYC, MKL 2024.2) the same
    strictness is asked on MKL's AUTO branch, which is what MKL itself does with MKL_CBWR=AVX2,STRICT there. After MKL's
    first computation the mode cannot change (False, unless it already is the one asked for).
    """
    lib = _lib()
    if lib is None:
        return False
    want = _encode(setting)
    rc = lib.mkl_serv_cbwr_set(want)
    if rc == _UNSUPPORTED_BRANCH:
        rc = lib.mkl_serv_cbwr_set((want & STRICT) | _encode("AUTO"))
    return rc == _SUCCESS


def threads() -> int | None:
    """Threads an MKL call on this thread would use now."""
    lib = _lib()
    return None if lib is None else int(lib.mkl_get_max_threads())


@contextlib.contextmanager
def local_threads(n: int):
    """MKL calls made by this thread use `n` threads inside the block; other threads are not affected."""
    lib = _lib()
    if lib is None:
        raise RuntimeError("MKL's per-thread thread count is not reachable in this torch build")
    previous = lib.MKL_Set_Num_Threads_Local(n)  # 0 means "the process-wide count"
    try:
        yield
    finally:
        lib.MKL_Set_Num_Threads_Local(previous)
