"""Process-level determinism: the deployment template, the fingerprint of every version that changes bits, the lock.
The runtime sits on the kernels: it pins their vendors (MKL through `kernels/cpu/mkl.py`, which the CPU route reads
too, so it lives below both) and fingerprints their configs and verdicts."""
from samebits.runtime.fingerprint import fingerprint, verify_lock, write_lock
from samebits.runtime.template import (
    TEMPLATE_ENV,
    RuntimeTemplateError,
    deterministic_runtime,
    env_problems,
    flag_problems,
    runtime_for,
    shell_exports,
)

__all__ = [
    "TEMPLATE_ENV",
    "RuntimeTemplateError",
    "deterministic_runtime",
    "env_problems",
    "fingerprint",
    "flag_problems",
    "runtime_for",
    "shell_exports",
    "verify_lock",
    "write_lock",
]
