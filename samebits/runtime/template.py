"""The deterministic deployment template (seed: solution 2, checklist items 2 and 4).

`deterministic_runtime()` applies it to this process and restores what it found on exit, so nesting and exceptions are
safe. `TEMPLATE_ENV` is the environment half: `samebits env --shell` prints it, `samebits env --check` verifies it.
"""
from __future__ import annotations

import contextlib
import os
from dataclasses import dataclass

from samebits.kernels.configs import TILE_CONFIGS
from samebits.kernels.cpu import mkl
from samebits.kernels.vector_math import settle

# cuBLAS reads CUBLAS_WORKSPACE_CONFIG when it creates its handle, so it must be set before CUDA work starts.
# CUBLASLT_WORKSPACE_SIZE (KiB) is read once, at torch's first cuBLASLt call: 1 KiB leaves cuBLASLt no room to split K,
# which is what lets kernels/vendor_gemm.py prove it bit-equal to the Triton matmul.
# NCCL: ring algorithm and simple protocol are pinned so a later tensor-parallel all-reduce has one reduction order;
# NVLS (NVLink multicast) is off because its in-switch reduction order is not ours to fix.
# MKL_CBWR: MKL's strict reproducible mode (kernels/configs.py `cpu_mkl` says why and which two are accepted), read
# once, at MKL's first computation; kernels/cpu/mkl.py pins it in-process, so entering the template before any matmul
# suffices.
TEMPLATE_ENV: dict[str, str] = {
    "CUBLAS_WORKSPACE_CONFIG": ":4096:8",
    "CUBLASLT_WORKSPACE_SIZE": "1",
    "NCCL_ALGO": "Ring",
    "NCCL_PROTO": "Simple",
    "NCCL_NVLS_ENABLE": "0",
    "MKL_CBWR": TILE_CONFIGS["cpu_mkl"]["config"]["cnr"],
}
# The device whose libraries read each variable: a machine without CUDA has no cuBLAS or NCCL to configure.
ENV_DEVICE: dict[str, str] = {"CUBLAS_WORKSPACE_CONFIG": "cuda", "CUBLASLT_WORKSPACE_SIZE": "cuda", "NCCL_ALGO": "cuda",
                              "NCCL_PROTO": "cuda", "NCCL_NVLS_ENABLE": "cuda", "MKL_CBWR": "cpu"}
READ_ONCE_ENV = ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE", "MKL_CBWR")
ACCEPTED_ENV: dict[str, set[str]] = {
    "CUBLAS_WORKSPACE_CONFIG": {":4096:8", ":16:8"},
    "MKL_CBWR": {TILE_CONFIGS["cpu_mkl"]["config"]["cnr"], TILE_CONFIGS["cpu_mkl"]["config"]["portable_cnr"]},
}


class RuntimeTemplateError(RuntimeError):
    """The deterministic template cannot be applied to this process."""


@dataclass(frozen=True)
class Problem:
    item: str
    expected: str
    actual: str


def shell_exports() -> str:
    return "\n".join(f"export {k}={v}" for k, v in TEMPLATE_ENV.items())


def env_problems(environ: dict[str, str] | None = None, devices: tuple[str, ...] = ("cpu", "cuda")) -> list[Problem]:
    """The template's variables that are missing or wrong, among those read on `devices`."""
    env = os.environ if environ is None else environ
    problems = []
    for key, want in TEMPLATE_ENV.items():
        if ENV_DEVICE[key] not in devices:
            continue
        got = env.get(key)
        if got not in ACCEPTED_ENV.get(key, {want}):
            problems.append(Problem(key, want, "<unset>" if got is None else got))
    return problems


def _torch_flags(torch) -> dict:
    import torch.utils.deterministic  # makes the attribute below resolvable

    b = torch.backends
    return {
        "deterministic_algorithms": torch.are_deterministic_algorithms_enabled(),
        "deterministic_warn_only": torch.is_deterministic_algorithms_warn_only_enabled(),
        "cudnn.deterministic": b.cudnn.deterministic,
        "cudnn.benchmark": b.cudnn.benchmark,
        "cudnn.allow_tf32": b.cudnn.allow_tf32,
        "cuda.matmul.allow_tf32": b.cuda.matmul.allow_tf32,
        "bf16_reduced_precision": b.cuda.matmul.allow_bf16_reduced_precision_reduction,
        "fp16_reduced_precision": b.cuda.matmul.allow_fp16_reduced_precision_reduction,
        "float32_matmul_precision": torch.get_float32_matmul_precision(),
        "fill_uninitialized_memory": torch.utils.deterministic.fill_uninitialized_memory,
    }


DETERMINISTIC_FLAGS = {
    "deterministic_algorithms": True,
    "deterministic_warn_only": False,
    "cudnn.deterministic": True,
    "cudnn.benchmark": False,
    "cudnn.allow_tf32": False,
    "cuda.matmul.allow_tf32": False,
    "bf16_reduced_precision": False,
    "fp16_reduced_precision": False,
    "float32_matmul_precision": "highest",
    # Deterministic mode would NaN-fill every torch.empty: one extra kernel per buffer on the hot path. samebits'
    # kernels write every output element (their tests poison outputs first), so the fill only costs time.
    "fill_uninitialized_memory": False,
}


def _set_torch_flags(torch, flags: dict) -> None:
    b = torch.backends
    torch.use_deterministic_algorithms(flags["deterministic_algorithms"], warn_only=flags["deterministic_warn_only"])
    b.cudnn.deterministic = flags["cudnn.deterministic"]
    b.cudnn.benchmark = flags["cudnn.benchmark"]
    b.cudnn.allow_tf32 = flags["cudnn.allow_tf32"]
    b.cuda.matmul.allow_tf32 = flags["cuda.matmul.allow_tf32"]
    b.cuda.matmul.allow_bf16_reduced_precision_reduction = flags["bf16_reduced_precision"]
    b.cuda.matmul.allow_fp16_reduced_precision_reduction = flags["fp16_reduced_precision"]
    torch.set_float32_matmul_precision(flags["float32_matmul_precision"])
    torch.utils.deterministic.fill_uninitialized_memory = flags["fill_uninitialized_memory"]


def flag_problems() -> list[Problem]:
    import torch

    now = _torch_flags(torch)
    return [Problem(k, str(v), str(now[k])) for k, v in DETERMINISTIC_FLAGS.items() if now[k] != v]


def _check_not_too_late(torch) -> None:
    if not torch.cuda.is_initialized():
        return
    bad = env_problems()
    cublas = [p for p in bad if p.item == "CUBLAS_WORKSPACE_CONFIG"]
    if cublas:
        raise RuntimeTemplateError(
            "CUDA is already initialised and CUBLAS_WORKSPACE_CONFIG was "
            f"{cublas[0].actual}; cuBLAS only reads it at start-up. Set it before the first CUDA call, e.g. "
            "`eval \"$(samebits env --shell)\"` before starting Python, or enter samebits.deterministic_runtime() "
            "before any CUDA work."
        )


@contextlib.contextmanager
def deterministic_runtime():
    """Apply the deployment template; restore the previous environment and torch flags on exit."""
    import torch

    _check_not_too_late(torch)
    saved_env = {k: os.environ.get(k) for k in TEMPLATE_ENV}
    saved_flags = _torch_flags(torch)
    cuda_was_up = torch.cuda.is_initialized()
    mkl_setting = mkl_setting_for(saved_env["MKL_CBWR"])
    mkl_pinned = mkl_cnr_pinned(mkl_setting)
    try:
        os.environ.update(_env_to_apply(saved_env, cuda_was_up, mkl_pinned, mkl_setting))
        _set_torch_flags(torch, DETERMINISTIC_FLAGS)
        yield
    finally:
        _set_torch_flags(torch, saved_flags)
        if torch.cuda.is_initialized() and not cuda_was_up:
            # cuBLAS read the template's values inside this block and keeps them for the process's life:
            # leave the variables telling the truth (and let later blocks in this process pass the check).
            for key in ("CUBLAS_WORKSPACE_CONFIG", "CUBLASLT_WORKSPACE_SIZE"):
                saved_env.pop(key)
        if mkl_pinned:
            saved_env.pop("MKL_CBWR")  # MKL keeps its mode for the process's life, as cuBLAS does
        _restore_env(saved_env)


def runtime_for(mode: str):
    """The deployment template in deterministic mode, nothing in fast mode: what each process that steps enters."""
    return deterministic_runtime() if mode == "deterministic" else contextlib.nullcontext()


def mkl_setting_for(current: str | None) -> str:
    """The MKL mode to pin: the one already exported if the template accepts it (the portable path), else its own."""
    return current if current in ACCEPTED_ENV["MKL_CBWR"] else TEMPLATE_ENV["MKL_CBWR"]


def mkl_cnr_pinned(setting: str) -> bool:
    """Pin MKL's reproducible mode now if MKL has not computed yet; True when `setting` is in force.

    False when MKL already runs in another mode (it computed before the template was entered) or is not reachable:
    not an error, because kernels/cpu/gemm.py proves the blocks it uses in whatever mode MKL runs, but the fingerprint
    then shows the other mode and the thread count may be pinned."""
    pinned = mkl.pin_cnr(setting)
    settle()  # MKL's mode is fixed now either way; settle its vector math before anything splits a first call
    return pinned


def _env_to_apply(saved: dict[str, str | None], cuda_was_up: bool, mkl_pinned: bool,
                  mkl_setting: str | None = None) -> dict[str, str]:
    """All of the template, except read-once values the libraries already read otherwise: a cuBLASLt size (then
    kernels/vendor_gemm.py sees the workspace is not pinned and keeps to the Triton matmul) and MKL's mode (then
    the variable keeps telling the truth about the MKL that computes)."""
    env = dict(TEMPLATE_ENV)
    if cuda_was_up and saved["CUBLASLT_WORKSPACE_SIZE"] != env["CUBLASLT_WORKSPACE_SIZE"]:
        del env["CUBLASLT_WORKSPACE_SIZE"]
    if not mkl_pinned:
        del env["MKL_CBWR"]
    elif mkl_setting:
        env["MKL_CBWR"] = mkl_setting
    return env


def _restore_env(saved: dict[str, str | None]) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v
