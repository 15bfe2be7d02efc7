"""`samebits lint`: find what breaks determinism in CUDA, Triton and PyTorch code, and in compiled kernels."""
from samebits.lint.cli import ARGS, lint, main, run
from samebits.lint.findings import Finding
from samebits.lint.rules import RULES, Rule

__all__ = ["ARGS", "RULES", "Finding", "Rule", "lint", "main", "run"]
