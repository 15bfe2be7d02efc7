"""Prompts as vLLM and OpenAI users write them -> token ids: vLLM's TextPrompt/TokensPrompt dicts, chat messages with
OpenAI content parts, the chat template's options. `LLM` and the server both come through here, so they render alike.
Every error is a FieldError naming the field it blames (the server's 400 names it as `param`)."""
from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import TypedDict

from samebits.errors import FieldError
from samebits.models.tool_parsers import parser_for

# A private-use character: in the rendered chat, MARK<i>MARK stands where user text spelled a special token.
MARK = "\ue000"
_MARKED = re.compile(f"{MARK}([0-9]+){MARK}")

# The template context's own names: chat_template_kwargs may not replace them (tools come through the tools field).
RESERVED_TEMPLATE_KWARGS = ("messages", "add_generation_prompt", "continue_final_message", "tools", "documents")


class TextPrompt(TypedDict):
    """vLLM's `TextPrompt`: a prompt as text, tokenized by the model's tokenizer."""

    prompt: str


class TokensPrompt(TypedDict):
    """vLLM's `TokensPrompt`: a prompt as token ids, used as they are."""

    prompt_token_ids: list[int]


class ChatTemplateError(FieldError):
    """The template itself refused the messages (its raise_exception, e.g. "roles must alternate")."""


def normalize_prompts(prompts, encode: Callable[[str], list[int]]) -> list[tuple[str | None, list[int]]]:
    """A prompt or a list of them -> (text or None, token ids) each. A prompt is a str, a list of token ids,
    {"prompt": str} or {"prompt_token_ids": [...]}."""
    if isinstance(prompts, (str, dict)) or (prompts and isinstance(prompts[0], int)):
        prompts = [prompts]
    return [_one(p, encode) for p in prompts]


def _one(p, encode) -> tuple[str | None, list[int]]:
    if isinstance(p, dict):
        keys = sorted(p)
        if keys == ["prompt"] and isinstance(p["prompt"], str):
            p = p["prompt"]
        elif keys == ["prompt_token_ids"]:
            p = p["prompt_token_ids"]
        else:
            raise FieldError("prompt",
                             f"prompt: a dict prompt holds exactly one of 'prompt' (a str) or 'prompt_token_ids', "
                             f"got keys {keys}")
    return (p, encode(p)) if isinstance(p, str) else (None, list(p))


def message_text(content, i: int) -> str:
    """Message i's content: a str, None ("") or OpenAI content parts, whose text parts are joined."""
    if content is None or isinstance(content, str):
        return content or ""
    texts = []
    for part in content:
        kind, text = part.get("type"), part.get("text")
        if kind != "text" or not isinstance(text, str):
            raise FieldError("messages",
                             f"messages[{i}].content: only text parts (with a text) are supported, got type {kind!r}")
        texts.append(text)
    return "".join(texts)


def chat_messages(messages: list[dict]) -> list[dict]:
    """Messages as the chat template expects them: content as text; an assistant's tool calls with their arguments
    as objects (what HF templates index, as vLLM hands them), a tool result's tool_call_id."""
    out = []
    for i, m in enumerate(messages):
        msg = {"role": m["role"], "content": message_text(m.get("content"), i)}
        if m.get("name"):
            msg["name"] = m["name"]
        if m.get("tool_calls"):
            msg["tool_calls"] = [_template_call(c, i) for c in m["tool_calls"]]
        if m.get("tool_call_id"):
            msg["tool_call_id"] = m["tool_call_id"]
        out.append(msg)
    return out


def _template_call(call: dict, i: int) -> dict:
    fn = call.get("function") or {}
    arguments = fn.get("arguments")
    try:
        arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
    except json.JSONDecodeError:
        raise FieldError("messages", f"messages[{i}].tool_calls: arguments must be a JSON object as text") from None
    if not isinstance(fn.get("name"), str) or not isinstance(arguments, dict):
        raise FieldError("messages",
                         f"messages[{i}].tool_calls: each call needs function.name and function.arguments (a JSON "
                         "object)")
    return {"id": call.get("id"), "type": "function", "function": {"name": fn["name"], "arguments": arguments}}


def tools_for_template(source: str, messages: list[dict], tools: list[dict] | None, parser) -> list[dict]:
    """For a template that knows no tools (its source never names `tools` / `tool_calls`; SmolLM2's, say), what it
    would drop written as text in `parser`'s family: the tools in a system prompt, each assistant's calls in its
    content. A template (its `source`) that knows them gets the messages as they are, and `tools` in its context."""
    if "tool_calls" not in source:
        messages = [{**{k: v for k, v in m.items() if k != "tool_calls"},
                     "content": "\n".join(x for x in (m["content"], parser.render_calls(
                         [c["function"] for c in m["tool_calls"]])) if x)} if m.get("tool_calls") else m
                    for m in messages]
    if tools and "tools" not in source:
        prompt = parser.system_prompt(tools)
        if messages and messages[0]["role"] == "system":
            messages = [{**messages[0], "content": f"{prompt}\n\n{messages[0]['content']}"}, *messages[1:]]
        else:
            messages = [{"role": "system", "content": prompt}, *messages]
    return messages


class Escapes:
    """User text with every special token's text (and MARK itself) swapped for a numbered mark before the template
    sees it, so that `<|im_end|>` typed by a user is encoded as the characters it spells, never as the special token
    (a user could otherwise close their turn and open a system one). Text without them is left exactly as it was,
    so its token ids are unchanged."""

    def __init__(self, special_texts) -> None:
        texts = sorted({*special_texts, MARK}, key=len, reverse=True)  # longest first: one special may hold another
        self.pattern = re.compile("|".join(map(re.escape, texts)))
        self.literals: list[str] = []

    def __call__(self, value):
        """A str, or the strs inside lists and dicts, escaped."""
        if isinstance(value, str):
            return self.pattern.sub(self._mark, value)
        if isinstance(value, list):
            return [self(v) for v in value]
        if isinstance(value, dict):
            return {k: self(v) for k, v in value.items()}
        return value

    def _mark(self, match: re.Match) -> str:
        self.literals.append(match.group(0))
        return f"{MARK}{len(self.literals) - 1}{MARK}"

    def encode(self, tokenizer, text: str) -> list[int]:
        """The rendered text's ids: the template's own special tokens as themselves, each mark as plain text."""
        if not self.literals:
            return tokenizer.encode(text, add_special_tokens=False)
        ids: list[int] = []
        for i, part in enumerate(_MARKED.split(text)):  # text, mark number, text, mark number, ..., text
            if i % 2:
                ids += tokenizer.encode(self.literals[int(part)], add_special_tokens=False, split_special_tokens=True)
            elif part:
                ids += tokenizer.encode(part, add_special_tokens=False)
        return ids


def render_chat(tokenizer, messages: list[dict], add_generation_prompt: bool = True,
                continue_final_message: bool = False, chat_template_kwargs: dict | None = None,
                tools: list[dict] | None = None, tool_parser: str = "auto") -> list[int]:
    """The chat prompt's token ids, as vLLM renders it: `continue_final_message` leaves the last message open (the
    model continues its text), `chat_template_kwargs` reach the template's context, `tools` (OpenAI's function
    tools) reach it as `tools`, as HF's apply_chat_template(tools=...) passes them. No user text (content, name,
    tools, tool calls, template kwargs) becomes a special token."""
    if add_generation_prompt and continue_final_message:
        raise FieldError("continue_final_message",
                         "continue_final_message cannot be combined with add_generation_prompt; set that to false")
    kwargs = dict(chat_template_kwargs or {})
    clash = [k for k in kwargs if k in RESERVED_TEMPLATE_KWARGS]
    if clash:
        raise FieldError("chat_template_kwargs",
                         f"chat_template_kwargs may not set {clash[0]!r} (a request field or refused)")
    # A tokenizer without special tokens (a test double) has nothing to escape.
    escapes = Escapes(getattr(tokenizer, "special_texts", ()))
    msgs = [{"role": m["role"], **escapes({k: v for k, v in m.items() if k != "role"})}
            for m in chat_messages(messages)]
    kwargs, tools = escapes(kwargs), escapes(tools) if tools else None
    source = getattr(tokenizer, "chat_template", None) or ""
    if tools or any("tool_calls" in m for m in msgs):
        msgs = tools_for_template(source, msgs, tools, parser_for(source, tool_parser))
        if tools and "tools" in source:
            kwargs["tools"] = tools
    try:
        text = tokenizer.apply_chat_template(msgs, add_generation_prompt=add_generation_prompt, **kwargs)
    # The template's own raise_exception is the caller's problem, whatever its type.
    except Exception as e:  # noqa: BLE001
        raise ChatTemplateError("messages", f"messages cannot be rendered by the chat template: {e}") from None
    if continue_final_message:
        final = msgs[-1]["content"]
        at = text.rfind(final) if final else -1
        if at < 0:
            raise FieldError("continue_final_message",
                             "continue_final_message needs a final message whose text the template renders as is")
        text = text[:at + len(final)]
    # Token ids, not text: the rendered template already holds its special tokens (no second BOS).
    return escapes.encode(tokenizer, text)
