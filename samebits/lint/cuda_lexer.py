"""A C/C++/CUDA tokenizer: enough to tell code from comments and string literals, which is all the CUDA rules need.

Not a preprocessor: macros are not expanded, directives are tokenized like code.
"""
from __future__ import annotations

import re
from dataclasses import dataclass

from samebits.lint.suppress import Comment

_TOKEN = re.compile(r"""
    (?P<comment>//[^\n]*|/\*.*?(\*/|\Z))
  | (?P<raw>(?:u8|u|U|L)?R"(?P<delim>[^()\\\s]{0,16})\(.*?\)(?P=delim)")
  | (?P<string>(?:u8|u|U|L)?"(?:\\.|[^"\\\n])*"?)
  | (?P<char>(?:u8|u|U|L)?'(?:\\.|[^'\\\n])*'?)
  | (?P<number>\.?\d(?:[eEpP][+-]|[\w.'])*)
  | (?P<ident>[A-Za-z_]\w*)
  | (?P<punct><<<|>>>|<<=|>>=|->\*?|::|\+\+|--|<<|>>|<=|>=|==|!=|&&|\|\||[-+*/%&|^]=|\#\#|[^\s\w])
  | (?P<space>\s+)
""", re.VERBOSE | re.DOTALL)


@dataclass(frozen=True)
class Token:
    kind: str  # comment, string, char, number, ident, punct
    text: str
    line: int
    col: int


def tokenize(source: str) -> list[Token]:
    tokens, line, line_start = [], 1, 0
    for m in _TOKEN.finditer(source):
        kind = "string" if m.lastgroup == "raw" else m.lastgroup
        if kind != "space":
            tokens.append(Token(kind, m.group(), line, m.start() - line_start + 1))
        newlines = m.group().count("\n")
        if newlines:
            line += newlines
            line_start = m.start() + m.group().rindex("\n") + 1
    return tokens


def comments(tokens: list[Token]) -> list[Comment]:
    """Comment tokens as suppress.Comment; `alone` when no code precedes them on their line."""
    out, last_code_line = [], 0
    for t in tokens:
        if t.kind == "comment":
            out.append(Comment(t.line, t.line + t.text.count("\n"), t.col, t.text, last_code_line != t.line))
        else:
            last_code_line = t.line + t.text.count("\n")
    return out


def code(tokens: list[Token]) -> list[Token]:
    return [t for t in tokens if t.kind != "comment"]
