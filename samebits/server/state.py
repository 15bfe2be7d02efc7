"""`ServerState`: what every request of one server shares (engine, tokenizer, limits, fingerprint, metrics)."""
from __future__ import annotations

import asyncio
import re
import time
from json.encoder import encode_basestring

from samebits.engine.interface import ServedEngine
from samebits.server.errors import clip, invalid, not_found
from samebits.server.metrics import Metrics
from samebits.server.supervisor import EngineSupervisor
from samebits.structured.grammar import Grammars

# max_prompt_chars' default per token of context: real text runs 3-5 characters a token, so only a prompt that could
# never fit is refused before it is tokenized (tokenizing 4 MB costs seconds of CPU).
PROMPT_CHARS_PER_TOKEN = 32


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
        "Weights": fp.get("weights"),
        "Dtype": fp.get("dtype"),
        "Tensor-Parallel-Size": fp["tensor_parallel"]["size"],
        "All-Reduce": fp["tensor_parallel"]["all_reduce"],
        "TP-Invariant": fp["tensor_parallel"]["invariant"],
    }
    return {f"X-Samebits-{k}": _header_value(v) for k, v in fields.items()}


def text_chars(req) -> tuple[int, str]:
    """(characters of text the request would tokenize, the field holding it): its string prompts, or its messages
    with the strings of chat_template_kwargs, which a template may render into the prompt."""
    prompt = getattr(req, "prompt", None)
    if prompt is not None:
        items = [prompt] if isinstance(prompt, str) else prompt
        return sum(len(p) for p in items if isinstance(p, str)), "prompt"
    total = _string_chars(req.chat_template_kwargs)
    for m in req.messages:
        content = m.content if isinstance(m.content, list) else [m.content]
        total += sum(len(part if isinstance(part, str) else part.text or "") for part in content if part is not None)
        total += len(m.name or "")
    return total, "messages"


def _string_chars(value) -> int:
    """Characters of every string (keys included) in a JSON value."""
    if isinstance(value, str):
        return len(value)
    if isinstance(value, dict):
        return sum(len(k) + _string_chars(v) for k, v in value.items())
    if isinstance(value, list):
        return sum(_string_chars(v) for v in value)
    return 0


def _vocab_size(engine) -> int:
    # The model's vocabulary bounds token ids; the tokenizer's can be smaller (padded embeddings) or larger.
    model_config = getattr(getattr(engine, "loaded", None), "config", None)
    size = getattr(engine, "vocab_size", None) or getattr(model_config, "vocab_size", None)
    return int(size or engine.tokenizer.vocab_size)


class ServerState:
    def __init__(self, async_engine: ServedEngine, config):
        engine = async_engine.engine
        self.ae = async_engine
        self.engine = engine
        self.config = config
        self.tokenizer = engine.tokenizer
        if config.chat_template is not None:  # --chat-template: the server renders every chat with it
            self.tokenizer.chat_template = config.chat_template_text()
        self.max_model_len = int(engine.max_model_len)
        self.vocab_size = _vocab_size(engine)
        self.fingerprint = dict(engine.fingerprint())
        self.headers = numerics_headers(self.fingerprint)
        self.api_keys = config.resolved_api_keys()
        self.metrics = Metrics(async_engine, config.model_name)
        self.supervisor = EngineSupervisor(async_engine, config.max_engine_restarts)
        self.metrics.watch(self.supervisor)
        self.created = int(time.time())
        self.max_prompt_chars = config.max_prompt_chars or PROMPT_CHARS_PER_TOKEN * self.max_model_len
        # The grammar compiler a request's constraint is checked with; the engine's own when it is in this process.
        self.grammars = getattr(engine, "grammars", None) or Grammars(self.tokenizer, self.vocab_size)
        # Big request bodies are parsed one at a time under it (server/requests.py BIG_BODY_BYTES).
        self.parse_turn = asyncio.Lock()
        self._token_text: dict[int, str] = {}
        self._token_json: dict[int, tuple[str, int]] = {}

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

    def token_json(self, token_id: int) -> tuple[str, int]:
        """(token_text as a JSON string, as the chunks' encoder writes it (ensure_ascii=False), its length)."""
        piece = self._token_json.get(token_id)
        if piece is None:
            text = self.token_text(token_id)
            piece = self._token_json[token_id] = (encode_basestring(text), len(text))
        return piece

    def check_model(self, model: str) -> None:
        # Only the served names: with --served-model-name, the real name (or path) is not a name clients may know.
        if model not in self.config.served_names:
            raise not_found(f"The model `{clip(model)}` does not exist; this server serves "
                            f"{', '.join(f'`{n}`' for n in self.config.served_names)}.", "model", "model_not_found")

    def check_text_size(self, req) -> None:
        """Refuse text too long to ever fit before anything tokenizes it."""
        chars, param = text_chars(req)
        if chars > self.max_prompt_chars:
            raise invalid(f"{param} holds {chars} characters of text; this server tokenizes at most "
                          f"{self.max_prompt_chars} per request (max_prompt_chars)", param, "prompt_too_long")

    def encode_prompt(self, text: str) -> list[int]:
        """A completion prompt's ids: special-token text in it stays plain text unless the operator allows it."""
        return self.tokenizer.encode(text, split_special_tokens=not self.config.allow_special_tokens)

    def default_max_tokens(self, prompt_len: int) -> int:
        """max_tokens of a chat request that sends none: the rest of the context, at most the server's cap."""
        return max(1, min(self.config.default_max_tokens, self.max_model_len - prompt_len))
