"""The CPU invariance checks under MKL and ATen code paths this machine would not take by itself (issue: CI and users
run on AMD and Intel CPUs whose MKL picks other kernels). Each path runs in a fresh process, its environment set before
torch loads: linear/matmul/bmm at model shapes, norms, softmax, silu, paged attention, one engine needle test."""
import json
import os
import subprocess
from pathlib import Path

import pytest
import torch

from tests.child import module_argv

_AVX512 = "avx512f" in Path("/proc/cpuinfo").read_text() if Path("/proc/cpuinfo").exists() else False
# name -> environment; every MKL/ATen variable not named here is removed, so a path is exactly what it says.
PATHS = {
    "stock": {},
    "mkl-cnr-avx2-strict": {"MKL_CBWR": "AVX2,STRICT"},
    "mkl-cnr-compatible": {"MKL_CBWR": "COMPATIBLE,STRICT"},
    "mkl-avx2": {"MKL_ENABLE_INSTRUCTIONS": "AVX2"},
    "mkl-avx512": {"MKL_ENABLE_INSTRUCTIONS": "AVX512"},
    "aten-avx2": {"ATEN_CPU_CAPABILITY": "avx2"},
    "one-thread": {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"},
}
_CLEARED = ("MKL_CBWR", "MKL_ENABLE_INSTRUCTIONS", "ATEN_CPU_CAPABILITY", "OMP_NUM_THREADS", "MKL_NUM_THREADS")


def _run(path_env: dict, seed: int) -> dict:
    env = {k: v for k, v in os.environ.items() if k not in _CLEARED}
    env.update(path_env)
    proc = subprocess.run(module_argv("tests.kernels.cpu_paths_worker", str(seed)), env=env, capture_output=True,
                          text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("name", list(PATHS))
def test_cpu_path_is_batch_invariant(name):
    if name == "mkl-avx512" and not _AVX512:
        pytest.skip("this CPU has no AVX-512")
    seed = int(torch.seed() % 2**31)
    report = _run(PATHS[name], seed)
    assert "error" not in report, report["error"]
    assert report["control"], "the row check did not see a deliberately M-dependent reduction"
    failed = {check: why for check, why in report["checks"].items() if why}
    assert not failed, f"{name} (seed {seed}, MKL CNR {report['mkl_cnr']}): {failed}"
    if name == "mkl-cnr-avx2-strict":
        assert report["mkl_cnr"] in ("AVX2,STRICT", "AUTO,STRICT")
    if name == "one-thread":
        assert report["threads"] == 1
