"""Tool calls as a model family writes them: text -> OpenAI tool calls, and the grammar that makes a model write one.

Two families, vLLM's names: `hermes` (Hermes, Qwen 2.5/3 and every ChatML model: `<tool_call>\\n{"name": ...,
"arguments": {...}}\\n</tool_call>`, one block per call) and `llama3_json` (Llama 3.1+: `{"name": ..., "parameters":
{...}}`, calls joined by `; `, optionally after `<|python_tag|>`). `parser_for` picks by the chat template; a template
that knows no tools gets `hermes`, whose system prompt then describes the tools (engine/prompts.py).

A parser's grammar is Lark as llguidance reads it: `%json{schema}` embeds a JSON schema, compiled with the rest, so
a call forced by `tool_choice` ("required" or a named function) always holds a known name and arguments that follow
that function's parameters. Arguments travel as JSON strings, as OpenAI's do.
"""
from __future__ import annotations

import json
import re
from dataclasses import dataclass

# Compact JSON inside a forced call: flexible whitespace lets a small model loop on newlines until max_tokens.
_COMPACT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


@dataclass(frozen=True)
class ToolCall:
    name: str
    arguments: str  # a JSON object as text


@dataclass(frozen=True)
class Parsed:
    content: str | None  # the text outside the calls; None when there is none
    calls: tuple[ToolCall, ...]


def function(tool: dict) -> dict:
    """The `function` of an OpenAI tool ({"type": "function", "function": {...}})."""
    return tool["function"]


def _call_schema(tools: list[dict], arguments_key: str) -> dict:
    options = [{"type": "object", "properties": {"name": {"const": function(t)["name"]},
                                                 arguments_key: function(t).get("parameters") or {"type": "object"}},
                "required": ["name", arguments_key], "additionalProperties": False} for t in tools]
    schema = options[0] if len(options) == 1 else {"anyOf": options}
    return {**schema, "x-guidance": _COMPACT}


def _lark(call: str, separator: str, parallel: bool) -> str:
    """One call, or with `parallel` one or more joined by `separator` (Lark literals)."""
    start = f"start: call ({separator} call)*" if parallel else "start: call"
    return f"{start}\ncall: {call}\n"


def _arguments_text(value) -> str | None:
    if isinstance(value, str):  # some models write the arguments as a JSON string
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return None
    return json.dumps(value, ensure_ascii=False) if isinstance(value, dict) else None


def _call(obj, arguments_key: str) -> ToolCall | None:
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return None
    arguments = _arguments_text(obj.get(arguments_key, obj.get("arguments", {})))
    return None if arguments is None else ToolCall(obj["name"], arguments)


class HermesParser:
    name = "hermes"
    start = "<tool_call>"
    _block = re.compile(r"<tool_call>\s*(.*?)\s*</tool_call>", re.DOTALL)

    def parse(self, text: str) -> Parsed:
        """Every complete `<tool_call>` block that holds a call; the text before the first is the content, text after
        the last is dropped. Text with a block that does not parse is all content (nothing is half-parsed)."""
        at = text.find(self.start)
        if at < 0:
            return Parsed(text, ())
        calls = []
        for block in self._block.findall(text[at:]):
            try:
                call = _call(json.loads(block), "arguments")
            except json.JSONDecodeError:
                call = None
            if call is None:
                return Parsed(text, ())
            calls.append(call)
        if not calls:
            return Parsed(text, ())
        content = text[:at]  # as streamed: whitespace before a call is no content
        return Parsed(content if content.strip() else None, tuple(calls))

    def grammar(self, tools: list[dict], parallel: bool) -> str:
        return _lark('"<tool_call>\\n" %json' + json.dumps(_call_schema(tools, "arguments")) + ' "\\n</tool_call>"',
                     '"\\n"', parallel)

    def render_calls(self, calls: list[dict]) -> str:
        """An assistant message's OpenAI tool_calls as this family writes them (for a template that drops them)."""
        return "\n".join(f"<tool_call>\n{json.dumps({'name': c['name'], 'arguments': c['arguments']}, ensure_ascii=False)}"
                         f"\n</tool_call>" for c in calls)

    def system_prompt(self, tools: list[dict]) -> str:
        """Hermes' own words, for a template that drops `tools`."""
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return ("You are a function calling AI model. You are provided with function signatures within <tools></tools> "
                "XML tags. You may call one or more functions to assist with the user query. Don't make assumptions "
                f"about what values to plug into functions. Here are the available tools: <tools>\n{listed}\n</tools>\n"
                "For each function call return a json object with function name and arguments within <tool_call>"
                "</tool_call> XML tags as follows:\n<tool_call>\n{\"name\": <function-name>, \"arguments\": "
                "<args-json-object>}\n</tool_call>")


class Llama3JsonParser:
    name = "llama3_json"
    start = "{"
    _tag = "<|python_tag|>"

    def parse(self, text: str) -> Parsed:
        """The whole text as calls (`{...}; {...}`, optionally after <|python_tag|>), or all of it as content."""
        body = text.strip()
        if body.startswith(self._tag):
            body = body[len(self._tag):].lstrip()
        if not body.startswith("{"):
            return Parsed(text, ())
        calls, decoder, at = [], json.JSONDecoder(), 0
        while at < len(body):
            try:
                obj, at = decoder.raw_decode(body, at)
            except json.JSONDecodeError:
                return Parsed(text, ())
            call = _call(obj, "parameters")
            if call is None:
                return Parsed(text, ())
            calls.append(call)
            rest = body[at:].lstrip()
            if rest and not rest.startswith(";"):
                return Parsed(text, ())
            at = len(body) - len(rest[1:].lstrip()) if rest else len(body)
        return Parsed(None, tuple(calls))

    def grammar(self, tools: list[dict], parallel: bool) -> str:
        return _lark("%json" + json.dumps(_call_schema(tools, "parameters")), '"; "', parallel)

    def render_calls(self, calls: list[dict]) -> str:
        return "; ".join(json.dumps({"name": c["name"], "parameters": c["arguments"]}, ensure_ascii=False)
                         for c in calls)

    def system_prompt(self, tools: list[dict]) -> str:
        listed = "\n".join(json.dumps(t, ensure_ascii=False) for t in tools)
        return ("Given the following functions, respond with a JSON for a function call with its proper arguments that "
                'best answers the given prompt. Respond in the format {"name": function name, "parameters": '
                f"dictionary of argument name and its value}}. Do not use variables.\n\n{listed}")


PARSERS = {p.name: p for p in (HermesParser(), Llama3JsonParser())}
TOOL_CALL_PARSERS = ("auto", *PARSERS)


def parser_for(chat_template: str | None, name: str = "auto"):
    """The named parser, or for "auto" the template's family: Llama 3's if it speaks of <|python_tag|> or ipython,
    else Hermes' (ChatML templates, and templates that know no tools)."""
    if name != "auto":
        if name not in PARSERS:
            raise ValueError(f"tool_call_parser must be one of {', '.join(TOOL_CALL_PARSERS)}, got {name!r}")
        return PARSERS[name]
    template = chat_template or ""
    if "<tool_call>" not in template and ("<|python_tag|>" in template or "ipython" in template):
        return PARSERS["llama3_json"]
    return PARSERS["hermes"]
