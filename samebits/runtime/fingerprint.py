"""Fingerprint of every version and setting that can change output bits, and the version lock built on it."""
from __future__ import annotations

import ctypes
import hashlib
import json
import os
import platform
from pathlib import Path

from samebits import __version__
from samebits.kernels import configs, vendor_fp8, vendor_gemm
from samebits.kernels.cpu import gemm as cpu_gemm
from samebits.kernels.cpu import mkl

# Fields that describe the run rather than the numerics: shown, never hashed.
# vendor_gemm, vendor_fp8: the vendor GEMM routes' self-test verdicts; a route is only taken where it gives the Triton
# kernel's bits, so a verdict never changes an output bit. cpu_gemm: the CPU route's verdicts; every block size it
# admits gives the canonical block's bits, and what those depend on (MKL's mode and answer, the thread count) is hashed.
UNHASHED = {"hash", "vendor_gemm", "vendor_fp8", "cpu_gemm"}


def _cpu_model() -> str:
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


def _blas_backend(torch) -> str:
    cfg = torch.__config__.show()
    for name in ("MKL", "OpenBLAS", "BLIS", "Accelerate"):
        if f"BLAS_INFO={name.lower()}" in cfg.replace(" ", "").lower() or f"USE_{name.upper()}=ON" in cfg:
            return name
    for line in cfg.splitlines():
        if "BLAS_INFO" in line:
            return line.split("=", 1)[1].split(",")[0].strip()
    return "unknown"


def _loaded_library(stem: str) -> str | None:
    try:
        for line in Path("/proc/self/maps").read_text().splitlines():
            path = line.split()[-1]
            if f"/{stem}" in path and ".so" in path:
                return path
    except OSError:
        pass
    return None


def cublas_version() -> str | None:
    """Read the version from the cuBLASLt library this process actually loaded (not the one torch was built with)."""
    path = _loaded_library("libcublasLt")
    if path is None:
        return None
    try:
        v = ctypes.CDLL(path).cublasLtGetVersion
        v.restype = ctypes.c_size_t
        n = int(v())
    except (OSError, AttributeError):
        return None
    return f"{n // 10000}.{n % 10000 // 100}.{n % 100}"


def cuda_driver_api_version() -> str | None:
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return None
    n = ctypes.c_int()
    if lib.cuDriverGetVersion(ctypes.byref(n)) != 0:
        return None
    return f"{n.value // 1000}.{n.value % 1000 // 10}"


def driver_version() -> str | None:
    """The kernel driver's own version (e.g. 580.159.04) from NVML; None without an NVIDIA driver."""
    try:
        lib = ctypes.CDLL("libnvidia-ml.so.1")
        if lib.nvmlInit_v2() != 0:
            return None
        buf = ctypes.create_string_buffer(96)
        ok = lib.nvmlSystemGetDriverVersion(buf, ctypes.c_uint(96)) == 0
        lib.nvmlShutdown()
    except (OSError, AttributeError):
        return None
    return buf.value.decode() if ok else None


def _cuda_fields(torch) -> dict:
    if not torch.cuda.is_available():
        return {"cuda_runtime": None, "cublas": None, "driver": driver_version(),
                "cuda_driver_api": cuda_driver_api_version(), "gpu": None}
    # A tiny matmul makes torch load cuBLAS(Lt), so the version read is the one that will compute.
    a = torch.ones(8, 8, device="cuda")
    (a @ a).sum().item()
    p = torch.cuda.get_device_properties(0)
    return {
        "cuda_runtime": torch.version.cuda,
        "cublas": cublas_version(),
        "driver": driver_version(),
        "cuda_driver_api": cuda_driver_api_version(),
        "gpu": {"name": p.name, "capability": f"{p.major}.{p.minor}", "sm_count": p.multi_processor_count},
    }


def _package_version(name: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _mkl_fields(torch) -> dict:
    """MKL as it computes in this process: version, reproducibility mode, threads, and the known answer of one
    canonical block of the CPU route (two machines with the same answer computed that block alike)."""
    version = next((line.strip(" -") for line in torch.__config__.show().splitlines() if "Math Kernel Library" in line),
                   None)
    return {"mkl": version, "mkl_cnr": mkl.cnr_mode(), "cpu_capability": torch.backends.cpu.get_cpu_capability(),
            "cpu_gemm_answer": cpu_gemm.known_answer(), "cpu_vector_math_answer": vector_math_answer(torch)}


def vector_math_answer(torch) -> str:
    """Hash of torch's CPU exp, log, rsqrt (float32) and exp, log, cos, sin (float64) on integer-built inputs: on the
    machines measured these follow MKL's vector-math code path, which MKL picks per CPU vendor and mode
    (kernels/configs.py `cpu_mkl`), so two machines with the same answer compute the model's elementwise math alike."""
    i = torch.arange(1 << 14, dtype=torch.int64)
    x = ((i * 2654435761 % 2001) - 1000).to(torch.float32) / 64.0
    xd = x.double() / 3.0
    parts = [torch.exp(x), torch.log(x.abs() + 1.0), torch.rsqrt(x.abs() + 1.0)]
    parts64 = [torch.exp(xd), torch.log(xd.abs() + 1.0), torch.cos(xd), torch.sin(xd)]
    digest = hashlib.sha256()
    for p in parts + parts64:
        digest.update(p.numpy().tobytes())
    return digest.hexdigest()[:16]


def _hash(fields: dict) -> str:
    body = {k: v for k, v in fields.items() if k not in UNHASHED}
    return hashlib.sha256(json.dumps(body, sort_keys=True).encode()).hexdigest()[:16]


def fingerprint(mode: str = "deterministic", tensor_parallel: dict | None = None, model: dict | None = None) -> dict:
    """Everything that can change output bits. `hash` is stable across processes on one machine and stack.
    `tensor_parallel`: the engine's TP size, all-reduce route and TP-invariant switch (distributed/__init__.py).
    `model`: the loaded model's weights digest, dtype and config digest (models/loader.py `LoadedModel.numerics`);
    without it the fingerprint is the runtime's alone, as `samebits fingerprint` and the lock show it."""
    import torch

    profile = configs.numerics_profile()
    fields = {
        "samebits": __version__,
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _package_version("triton"),
        # The grammar library decides which tokens a constrained request may draw (structured/grammar.py).
        "llguidance": _package_version("llguidance"),
        **_cuda_fields(torch),
        "cpu": _cpu_model(),
        "blas": _blas_backend(torch),
        "cpu_threads": torch.get_num_threads(),
        **_mkl_fields(torch),
        **(model or {}),
        "mode": mode,
        "tensor_parallel": tensor_parallel or {"size": 1, "all_reduce": None, "invariant": False},
        "numerics_profile": hashlib.sha256(json.dumps(profile, sort_keys=True).encode()).hexdigest()[:16],
        "vendor_gemm": vendor_gemm.verdicts(),
        "vendor_fp8": vendor_fp8.verdicts(),
        "cpu_gemm": cpu_gemm.verdicts(),
    }
    fields["hash"] = _hash(fields)
    return fields


def with_fields(fp: dict, **fields) -> dict:
    """A copy of fingerprint `fp` with `fields` set and the hash recomputed over them (e.g. the weights version
    after `LLM.update_weights`)."""
    out = {**fp, **fields}
    out["hash"] = _hash(out)
    return out


def write_lock(path: str | os.PathLike = "samebits.lock", mode: str = "deterministic") -> dict:
    """The runtime's fingerprint, without a model's fields: a lock pins the software and hardware a deployment must
    reproduce, and holds for every model served on it. The weights change at every RL weight sync; they are named
    per answer instead (the served fingerprint's `weights`, `X-Samebits-Weights`)."""
    fp = fingerprint(mode)
    Path(path).write_text(json.dumps(fp, indent=2, sort_keys=True) + "\n")
    return fp


def diff_fingerprints(locked: dict, current: dict) -> list[tuple[str, object, object]]:
    keys = sorted((set(locked) | set(current)) - UNHASHED)
    return [(k, locked.get(k), current.get(k)) for k in keys if locked.get(k) != current.get(k)]


def verify_lock(path: str | os.PathLike = "samebits.lock", mode: str | None = None) -> list[tuple[str, object, object]]:
    """Fields that drifted since the lock was written: (field, locked, now). Empty means no drift.
    ValueError when the file is not a lock (not JSON, or not a JSON object)."""
    locked = json.loads(Path(path).read_text())
    if not isinstance(locked, dict):
        # A lock file that is not an object is bad input, reported like every config error.
        raise ValueError(f"expected a JSON object, found {type(locked).__name__}")  # noqa: TRY004
    return diff_fingerprints(locked, fingerprint(mode or locked.get("mode", "deterministic")))
