"""`samebits check URL`: a black-box determinism check of any OpenAI-compatible endpoint (completions and chat)."""
from samebits.check.config import EXPERIMENTS, CheckConfig
from samebits.check.runner import run

__all__ = ["EXPERIMENTS", "CheckConfig", "run"]
