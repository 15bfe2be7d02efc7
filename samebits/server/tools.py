"""Tool calling on /v1/chat/completions: `tools`, `tool_choice`, `parallel_tool_calls` -> a ToolPlan; the answer's
text -> OpenAI `tool_calls` in the body (the stream's deltas: server/tool_stream.py).

The tools reach the chat template (engine/prompts.py render_chat). The model family's parser (models/tool_parsers.py,
`--tool-call-parser`, by default picked from the template) reads the calls out of the text. `tool_choice: "auto"`
(the default with tools) leaves the model free and parses what it wrote; `"required"` and a named function force a
call with the parser's grammar, so its name is a tool's and its arguments follow that tool's parameters; `"none"`
parses nothing. `parallel_tool_calls: false` allows one call (forced: by the grammar; auto: the first is kept).
"""
from __future__ import annotations

import re
import uuid
from dataclasses import dataclass

from samebits.models.tool_parsers import parser_for
from samebits.server.errors import invalid
from samebits.structured.params import StructuredOutputsParams

CHOICES = ("none", "auto", "required")
# OpenAI's rule for a function's name.
NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")
MAX_TOOLS = 128


@dataclass(frozen=True)
class ToolPlan:
    parser: object  # a models.tool_parsers parser
    tools: list[dict]  # OpenAI's function tools, as the chat template receives them
    choice: str  # "none" | "auto" | "required" | "named"
    parallel: bool
    named: str | None = None

    @property
    def forced(self) -> StructuredOutputsParams | None:
        """The grammar of a forced call (required or named), else None."""
        if self.choice == "required":
            return StructuredOutputsParams(grammar=self.parser.grammar(self.tools, self.parallel))
        if self.choice == "named":
            tools = [t for t in self.tools if t["function"]["name"] == self.named]
            return StructuredOutputsParams(grammar=self.parser.grammar(tools, False))
        return None

    def calls(self, text: str):
        """(content, calls) of a finished answer; no calls when the plan parses none or the text holds none."""
        if self.choice == "none":
            return text, ()
        parsed = self.parser.parse(text)
        if not parsed.calls:
            return text, ()
        return parsed.content, parsed.calls if self.parallel else parsed.calls[:1]

    def finish(self, finish_reason: str | None) -> str | None:
        """OpenAI's finish_reason once calls were made: tool_calls, but stop for a named function (as OpenAI)."""
        return finish_reason if finish_reason != "stop" or self.choice == "named" else "tool_calls"

    def reply(self, text: str, finish_reason: str | None) -> tuple[dict, str | None]:
        """(the assistant message, finish_reason) of one finished choice."""
        content, calls = self.calls(text)
        if not calls:
            return {"role": "assistant", "content": text}, finish_reason
        return ({"role": "assistant", "content": content, "tool_calls": [openai_call(c) for c in calls]},
                self.finish(finish_reason))


def openai_call(call) -> dict:
    return {"id": f"call_{uuid.uuid4().hex[:24]}", "type": "function",
            "function": {"name": call.name, "arguments": call.arguments}}


def _tool(i: int, t) -> dict:
    where = f"tools[{i}]"
    for obj, at in ((t, where), (t.function, f"{where}.function")):
        for name in obj.model_extra or {}:
            raise invalid(f"{at}.{name} is not a field samebits knows; leave it out", "tools")
    if t.type != "function":
        raise invalid(f"{where}.type must be 'function', got {t.type!r}", "tools")
    fn = t.function
    if not NAME.match(fn.name):
        raise invalid(f"{where}.function.name must be 1 to 64 letters, digits, '_' or '-', got {fn.name!r}", "tools")
    out = {"name": fn.name, **({"description": fn.description} if fn.description is not None else {}),
           "parameters": fn.parameters if fn.parameters is not None else {"type": "object", "properties": {}}}
    return {"type": "function", "function": out}


def _choice(value, names: list[str]) -> tuple[str, str | None]:
    if isinstance(value, str):
        if value not in CHOICES:
            raise invalid(f"tool_choice must be one of {', '.join(CHOICES)} or a function, got {value!r}",
                          "tool_choice")
        return value, None
    fn = value.get("function") if isinstance(value, dict) and value.get("type") == "function" else None
    name = fn.get("name") if isinstance(fn, dict) else None
    if not isinstance(name, str):
        raise invalid('tool_choice must be a string or {"type": "function", "function": {"name": ...}}',
                      "tool_choice")
    if name not in names:
        raise invalid(f"tool_choice names {name!r}, which is not among the tools", "tool_choice")
    return "named", name


def tool_plan(req, parser_name: str = "auto", tokenizer=None) -> ToolPlan | None:
    """The request's plan, or None without tools; a 400 naming the field for what cannot be served. The parser is
    `parser_name`'s, or for "auto" the one the tokenizer's chat template speaks."""
    tools = [_tool(i, t) for i, t in enumerate(req.tools or ())]
    if len(tools) > MAX_TOOLS:
        raise invalid(f"tools may hold at most {MAX_TOOLS} functions, got {len(tools)}", "tools")
    names = [t["function"]["name"] for t in tools]
    if len(set(names)) != len(names):
        raise invalid("tools: function names must be unique", "tools")
    value = req.tool_choice if req.tool_choice is not None else ("auto" if tools else "none")
    choice, named = _choice(value, names)
    if not tools:
        if choice in ("required", "named"):
            raise invalid(f"tool_choice {value!r} needs tools", "tool_choice")
        return None
    parallel = req.parallel_tool_calls is not False
    return ToolPlan(parser_for(getattr(tokenizer, "chat_template", None), parser_name), tools, choice, parallel,
                    named)
