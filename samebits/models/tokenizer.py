"""Tokenizer over the `tokenizers` library, with chat templates rendered the way transformers renders them.

No transformers import at run time: the jinja environment below mirrors `transformers.utils.chat_template_utils`
(sandboxed, trim_blocks/lstrip_blocks, loopcontrols, `raise_exception`, a non-escaping `tojson`, `strftime_now`), and
the special-token strings are passed to the template like `tokenizer.special_tokens_map` is.
"""
from __future__ import annotations

import json
from datetime import datetime
from functools import cached_property, lru_cache
from pathlib import Path
from typing import ClassVar

import jinja2
import jinja2.ext
from jinja2 import nodes
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer as _Backend

SPECIAL_TOKEN_KEYS = ("bos_token", "eos_token", "unk_token", "sep_token", "pad_token", "cls_token", "mask_token")


class Tokenizer:
    def __init__(self, backend: _Backend, special_tokens: dict[str, str] | None = None, chat_template: str | None = None,
                 extra_eos_ids=()):
        self.backend = backend
        self.special_tokens = {k: v for k, v in (special_tokens or {}).items() if v is not None}
        self.chat_template = chat_template
        self.eos_token_ids: set[int] = set(extra_eos_ids) | self._ids_of(["eos_token"])

    def _ids_of(self, keys) -> set[int]:
        ids = (self.backend.token_to_id(self.special_tokens[k]) for k in keys if k in self.special_tokens)
        return {i for i in ids if i is not None}

    @property
    def vocab_size(self) -> int:
        return self.backend.get_vocab_size(with_added_tokens=True)

    @property
    def bos_token_id(self) -> int | None:
        return next(iter(self._ids_of(["bos_token"])), None)

    @cached_property
    def special_texts(self) -> tuple[str, ...]:
        """The text of every special token (`<|im_end|>`, `<|eot_id|>`...): what user text must never turn into."""
        return tuple(t.content for t in self.backend.get_added_tokens_decoder().values() if t.special)

    @cached_property
    def _plain(self) -> _Backend:
        # A copy that reads special-token text as plain text (HF's `split_special_tokens`); a copy, not a toggle of
        # the shared backend, because the server encodes in several threads at once.
        backend = _Backend.from_str(self.backend.to_str())
        backend.encode_special_tokens = True
        return backend

    def encode(self, text: str, add_special_tokens: bool = True, split_special_tokens: bool = False) -> list[int]:
        """Like HF `tokenizer.encode`. Encode a rendered chat with `add_special_tokens=False` (the template has them);
        `split_special_tokens` encodes `<|im_end|>` in the text as the characters it spells, never the special token.
        Through `encode_batch`, which releases the GIL: `encode` holds it for the whole call, seconds on a megabyte
        of text, and the server's event loop would stall behind it."""
        backend = self._plain if split_special_tokens else self.backend
        return backend.encode_batch([text], add_special_tokens=add_special_tokens)[0].ids

    def decode(self, ids, skip_special_tokens: bool = True) -> str:
        return self.backend.decode(list(ids), skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict], add_generation_prompt: bool = True, **kwargs) -> str:
        if not self.chat_template:
            raise ValueError("this model has no chat template; send plain prompts instead")
        template = _compile(self.chat_template)
        context = {**self.special_tokens, **kwargs}
        context.setdefault("tools", None)
        context.setdefault("documents", None)
        return template.render(messages=messages, add_generation_prompt=add_generation_prompt, **context)

    def encode_chat(self, messages: list[dict], add_generation_prompt: bool = True) -> list[int]:
        return self.encode(self.apply_chat_template(messages, add_generation_prompt), add_special_tokens=False)

    def hf_config(self) -> dict:
        """tokenizer_config.json of this tokenizer as transformers reads it back (PreTrainedTokenizerFast over
        tokenizer.json), vLLM's /tokenizer_info body too: the special tokens' text and the chat template. No clean-up
        of spaces on decode: the `tokenizers` backend does none, and the exported folder must decode the same."""
        return {"tokenizer_class": "PreTrainedTokenizerFast", "clean_up_tokenization_spaces": False,
                **self.special_tokens, "chat_template": self.chat_template}

    def save_pretrained(self, path: Path) -> list[Path]:
        """An HF tokenizer folder (`AutoTokenizer.from_pretrained(path)`) for whatever this was loaded from, a GGUF
        file included: tokenizer.json, tokenizer_config.json, special_tokens_map.json. Returns the files written."""
        path = Path(path)
        path.mkdir(parents=True, exist_ok=True)
        files = [path / "tokenizer.json", path / "tokenizer_config.json", path / "special_tokens_map.json"]
        self.backend.save(str(files[0]))
        config = {k: v for k, v in self.hf_config().items() if v is not None}
        files[1].write_text(json.dumps(config, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        files[2].write_text(json.dumps(self.special_tokens, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
        return files

    @classmethod
    def from_hf_dir(cls, path: Path, extra_eos_ids=()) -> Tokenizer:
        path = Path(path)
        file = path / "tokenizer.json"
        if not file.is_file():
            raise FileNotFoundError(f"no tokenizer.json in {path} (only fast tokenizers are supported)")
        config = _read_json(path / "tokenizer_config.json")
        specials = {k: _token_text(config.get(k)) for k in SPECIAL_TOKEN_KEYS}
        return cls(_Backend.from_file(str(file)), specials, _hf_chat_template(path, config), extra_eos_ids)


def _read_json(file: Path) -> dict:
    return json.loads(file.read_text(encoding="utf-8")) if file.is_file() else {}


def _token_text(value) -> str | None:
    """tokenizer_config.json writes special tokens as a string or as a serialized AddedToken dict."""
    return value.get("content") if isinstance(value, dict) else value


def _hf_chat_template(path: Path, config: dict) -> str | None:
    """chat_template.jinja wins over tokenizer_config.json, as in transformers; a named list picks 'default'."""
    file = path / "chat_template.jinja"
    if file.is_file():
        return file.read_text(encoding="utf-8")
    template = config.get("chat_template")
    if isinstance(template, list):
        named = {t["name"]: t["template"] for t in template}
        return named.get("default")
    return template


def _raise_exception(message):
    raise jinja2.exceptions.TemplateError(message)


def _tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
    # jinja's own tojson HTML-escapes; transformers' does not, and the prompt bits must match it.
    return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)


def _strftime_now(fmt):
    return datetime.now().strftime(fmt)


class _GenerationTag(jinja2.ext.Extension):
    """`{% generation %}` marks assistant text for transformers' masks; rendering it is just its body."""

    tags: ClassVar[set[str]] = {"generation"}

    def parse(self, parser):
        lineno = next(parser.stream).lineno
        body = parser.parse_statements(("name:endgeneration",), drop_needle=True)
        return nodes.CallBlock(self.call_method("_body"), [], [], body).set_lineno(lineno)

    def _body(self, caller):
        return caller()


@lru_cache(maxsize=16)
def _compile(source: str) -> jinja2.Template:
    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[_GenerationTag, jinja2.ext.loopcontrols])
    env.filters["tojson"] = _tojson
    env.globals.update(raise_exception=_raise_exception, strftime_now=_strftime_now)
    return env.from_string(source)
