"""`ServerState`: what every request of one server shares (engine, tokenizer, limits, fingerprint, metrics)."""
from __future__ import annotations

import re
import time

from samebits.server.errors import not_found
from samebits.server.metrics import Metrics


def _header_value(value) -> str:
    text = "none" if value is None else str(value)
    return re.sub(r"[^\x20-\x7e]", "?", text)


def numerics_headers(fp: dict) -> dict[str, str]:
    fields = {
        "Fingerprint": fp["hash"],
        "Engine-Version": fp["samebits"],
        "Torch-Version": fp["torch"],
        "Cuda-Version": fp["cuda_runtime"],
        "Cublas-Version": fp["cublas"],
        "Driver-Version": fp["driver"],
        "Kernel-Flags": fp["numerics_profile"],
        "Mode": fp["mode"],
        "Tensor-Parallel-Size": fp["tensor_parallel"]["size"],
        "All-Reduce": fp["tensor_parallel"]["all_reduce"],
        "TP-Invariant": fp["tensor_parallel"]["invariant"],
    }
    return {f"X-Samebits-{k}": _header_value(v) for k, v in fields.items()}


def _vocab_size(engine) -> int:
    # The model's vocabulary bounds token ids; the tokenizer's can be smaller (padded embeddings) or larger.
    model_config = getattr(getattr(engine, "loaded", None), "config", None)
    size = getattr(engine, "vocab_size", None) or getattr(model_config, "vocab_size", None)
    return int(size or engine.tokenizer.vocab_size)


class ServerState:
    def __init__(self, async_engine, config):
        engine = async_engine.engine
        self.ae = async_engine
        self.engine = engine
        self.config = config
        self.tokenizer = engine.tokenizer
        self.max_model_len = int(engine.max_model_len)
        self.vocab_size = _vocab_size(engine)
        self.fingerprint = dict(engine.fingerprint())
        self.headers = numerics_headers(self.fingerprint)
        self.metrics = Metrics(async_engine, config.model_name)
        self.created = int(time.time())
        self._token_text: dict[int, str] = {}

    @property
    def model_name(self) -> str:
        return self.config.model_name

    def draw_seed(self) -> int:
        """A request's seed when it sends none, from the engine's one seed stream (`--seed`). Drawn before the
        request is queued, so every engine request of one HTTP request shares it and the header knows it."""
        return self.engine.draw_seed()

    def token_text(self, token_id: int) -> str:
        text = self._token_text.get(token_id)
        if text is None:
            text = self._token_text[token_id] = self.tokenizer.decode([token_id], skip_special_tokens=False)
        return text

    def check_model(self, model: str) -> None:
        if model not in (self.model_name, self.config.engine.model):
            raise not_found(f"The model `{model}` does not exist; this server serves `{self.model_name}`.",
                            "model", "model_not_found")
