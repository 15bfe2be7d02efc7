"""`samebits lint`: find what breaks determinism in CUDA, Triton and PyTorch code, and in compiled kernels."""
from samebits.diagnostics.lint.cli import ARGS, lint, main, run
from samebits.diagnostics.lint.findings import Finding
from samebits.diagnostics.lint.rules import RULES, Rule

__all__ = ["ARGS", "RULES", "Finding", "Rule", "lint", "main", "run"]
