"""CUDA/C++ rules (SB1xx), all lexical: on the token stream, so comments and string literals never match.

Types are resolved only as far as a file's own declarations go: an atomicAdd whose target and value types cannot be
seen is not reported (the compiled check, SB401/SB402, sees the instruction the compiler actually emitted).
"""
from __future__ import annotations

from collections.abc import Iterator
from itertools import pairwise

from samebits.lint.cuda_lexer import Token, code, comments, tokenize
from samebits.lint.findings import Finding
from samebits.lint.hits import Hit, findings
from samebits.lint.names import BATCH, GRID_TARGET, PTX_FLOAT_ATOMIC, SM_API, SM_NAME, SPLIT

ATOMIC_ADDS = {"atomicAdd", "atomicAdd_block", "atomicAdd_system", "gpuAtomicAdd", "gpuAtomicAddNoReturn",
               "fastAtomicAdd", "unsafeAtomicAdd"}
# scalar_t/accscalar_t/opmath_t: PyTorch's names for the dispatched floating type.
FLOAT_TYPES = {"float", "double", "half", "__half", "__half2", "half2", "__nv_bfloat16", "__nv_bfloat162",
               "nv_bfloat16", "nv_bfloat162", "bfloat16", "Half", "BFloat16", "half_t", "bfloat16_t", "float2",
               "float4", "double2", "scalar_t", "accscalar_t", "opmath_t", "acc_t"}
INT_TYPES = {"int", "unsigned", "long", "short", "char", "size_t", "int32_t", "int64_t", "uint32_t", "uint64_t",
             "index_t", "bool", "int8_t", "uint8_t", "uint16_t", "int16_t"}
QUALIFIERS = {"const", "volatile", "__restrict__", "restrict", "*", "&", "__shared__", "static", "register"}
ASM = {"asm", "__asm__", "__asm"}
CALL_AFTER = {"return", "else", "do", "case", "co_return", "throw"}  # keywords after which a name is called
ASSIGN_OPS = {"=", "+=", "-=", "*=", "/=", "%=", "<<=", ">>=", "|=", "&=", "^="}


def check_cuda(path: str, source: str) -> list[Finding]:
    tokens = tokenize(source)
    toks = code(tokens)
    hits = [*_float_atomic_adds(toks), *_inline_ptx(toks), *_sm_count_grids(toks), *_splits_from_batch(toks)]
    return findings(path, hits, comments(tokens))


def _closing(toks: list[Token], i: int) -> int:
    """Index of the bracket closing the one at toks[i] (len(toks) when unbalanced)."""
    pairs = {"(": ")", "[": "]", "{": "}"}
    open_, close, depth = toks[i].text, pairs[toks[i].text], 0
    for j in range(i, len(toks)):
        depth += (toks[j].text == open_) - (toks[j].text == close)
        if depth == 0:
            return j
    return len(toks)


def _line(toks: list[Token], i: int) -> int:
    return toks[min(i, len(toks) - 1)].line


def _split_args(toks: list[Token]) -> list[list[Token]]:
    args, cur, depth = [], [], 0
    for t in toks:
        if t.text in {"(", "[", "{"}:
            depth += 1
        elif t.text in {")", "]", "}"}:
            depth -= 1
        if t.text == "," and depth == 0:
            args.append(cur)
            cur = []
        else:
            cur.append(t)
    return args + [cur]


def _declarations(toks: list[Token]) -> dict[str, list[tuple[int, bool]]]:
    """name -> [(token index, is float)] for `TYPE [qualifiers] name`, in file order."""
    decls: dict[str, list[tuple[int, bool]]] = {}
    for i, t in enumerate(toks):
        if t.kind != "ident" or t.text not in FLOAT_TYPES | INT_TYPES:
            continue
        j = i + 1
        while j < len(toks) and (toks[j].text in QUALIFIERS or toks[j].text in INT_TYPES):
            j += 1
        if j < len(toks) and toks[j].kind == "ident":
            decls.setdefault(toks[j].text, []).append((j, t.text in FLOAT_TYPES))
    return decls


def _declared_float(decls, name: str, at: int) -> bool | None:
    before = [f for idx, f in decls.get(name, []) if idx < at]
    return before[-1] if before else None


def _target_name(arg: list[Token]) -> str | None:
    """The array or pointer an atomic's address names: `&out[i]` -> out, `p + k` -> p, `&s.acc[0]` -> acc."""
    name = None
    for t in arg:
        if t.text in ("[", "+", "-") and name:
            break
        if t.kind == "ident":
            name = t.text
    return name


def _value_is_float(arg: list[Token], decls, at: int) -> bool | None:
    if len(arg) == 1 and arg[0].kind == "number":
        text = arg[0].text.lower()
        return not text.startswith("0x") and any(c in text for c in ".ef")
    names = [t.text for t in arg if t.kind == "ident"]
    if any(n in FLOAT_TYPES for n in names):
        return True
    kinds = {_declared_float(decls, n, at) for n in names} - {None}
    return True if True in kinds else False if kinds else None


def _atomic_is_float(args: list[list[Token]], decls, at: int) -> bool:
    target = [t.text for t in args[0] if t.kind == "ident"]
    if any(n in FLOAT_TYPES for n in target):  # reinterpret_cast<float*>(p), (__half*)q
        return True
    if any(n in INT_TYPES for n in target):
        return False
    name = _target_name(args[0])
    kind = _declared_float(decls, name, at) if name else None
    if kind is None and len(args) > 1:
        kind = _value_is_float(args[1], decls, at)
    return bool(kind)


def _declares(toks: list[Token], i: int) -> bool:
    """`float atomicAdd(float* p, float v)`: a type before the name makes it the function's declaration, not a call."""
    return i > 0 and toks[i - 1].kind == "ident" and toks[i - 1].text not in CALL_AFTER


def _float_atomic_adds(toks: list[Token]) -> Iterator[Hit]:
    decls = _declarations(toks)
    for i, t in enumerate(toks[:-1]):
        if t.kind == "ident" and t.text in ATOMIC_ADDS and toks[i + 1].text == "(" and not _declares(toks, i):
            end = _closing(toks, i + 1)
            args = _split_args(toks[i + 2:end])
            if _atomic_is_float(args, decls, i):
                yield Hit("SB101", t.line, t.col, f"{t.text} on a floating-point value", _line(toks, end))


def _inline_ptx(toks: list[Token]) -> Iterator[Hit]:
    for i, t in enumerate(toks):
        if t.kind != "ident" or t.text not in ASM:
            continue
        j = i + 1
        while j < len(toks) and toks[j].kind == "ident":  # volatile, __volatile__, goto
            j += 1
        if j < len(toks) and toks[j].text == "(":
            end = _closing(toks, j)
            text = " ".join(s.text for s in toks[j:end] if s.kind == "string")
            m = PTX_FLOAT_ATOMIC.search(text)
            if m:
                yield Hit("SB102", t.line, t.col, f"inline PTX `{m.group()}`", _line(toks, end))


def _statements(toks: list[Token]) -> list[list[list[Token]]]:
    """Per top-level block (a function, mostly), its token runs between `;`, `{` and `}` outside parentheses (a `for`
    header stays whole)."""
    scopes, out, cur, depth, braces = [], [], [], 0, 0
    for t in toks:
        depth += (t.text == "(") - (t.text == ")")
        if depth == 0 and t.text in (";", "{", "}") and t.kind == "punct":
            if cur:
                out.append(cur)
            cur = []
            braces += (t.text == "{") - (t.text == "}")
            if t.text == "}" and braces <= 0:
                scopes.append(out)
                out, braces = [], 0
        else:
            cur.append(t)
    return [*scopes, out + ([cur] if cur else [])]


def _is_sm(t: Token, taint: set[str]) -> bool:
    return t.kind == "ident" and (bool(SM_NAME.match(t.text)) or t.text in taint)


def _assigned(stmt: list[Token]) -> list[str]:
    """Names a statement writes: `x = ...`, `x += ...`, and the out-parameter `&x` of an SM-count or occupancy API."""
    out = [a.text for a, b in pairwise(stmt) if a.kind == "ident" and b.text in ASSIGN_OPS]
    if any(t.kind == "ident" and SM_API.match(t.text) for t in stmt):
        out += [b.text for a, b in pairwise(stmt) if a.text == "&" and b.kind == "ident"]
    return out


def _sm_taint(stmts: list[list[Token]]) -> set[str]:
    taint: set[str] = set()
    for _ in range(3):  # three assignments deep, as for the Python rule
        for s in stmts:
            if any(_is_sm(t, taint) for t in s):
                taint |= {n for n in _assigned(s) if not SM_NAME.match(n)}
    return taint


def _sm_sink(stmt: list[Token], taint: set[str]) -> str | None:
    texts = [t.text for t in stmt]
    if "<<<" in texts and ">>>" in texts:
        lo, hi = texts.index("<<<"), texts.index(">>>")
        if any(_is_sm(t, taint) for t in stmt[lo:hi]):
            return "launch configuration"
    if not any(_is_sm(t, taint) for t in stmt):
        return None
    if texts[0] == "for":
        return "loop bound"
    if "dim3" in texts:
        return "grid (dim3)"
    if "=" not in texts:
        return None
    eq = texts.index("=")
    if any(GRID_TARGET.search(n) for n in texts[:eq]) and any(_is_sm(t, taint) for t in stmt[eq + 1:]):
        return f"`{texts[eq - 1]}`"
    return None


def _sm_count_grids(toks: list[Token]) -> Iterator[Hit]:
    for stmts in _statements(toks):
        taint = _sm_taint(stmts)
        for s in stmts:
            what = _sm_sink(s, taint)
            if what:
                yield Hit("SB103", s[0].line, s[0].col, f"{what} derived from the SM count or occupancy", s[-1].line)
                taint -= set(_assigned(s))  # reported where derived: its launch is not reported again


def _splits_from_batch(toks: list[Token]) -> Iterator[Hit]:
    for s in (s for stmts in _statements(toks) for s in stmts):
        texts = [t.text for t in s]
        if "=" not in texts or texts[0] == "for":
            continue
        eq = texts.index("=")
        target = next((t.text for t in reversed(s[:eq]) if t.kind == "ident"), "")
        rhs = s[eq + 1:]
        by_size = any(a.text == "size" and b.text == "(" and c.text == "0" for a, b, c in zip(rhs, rhs[1:], rhs[2:]))
        if SPLIT.search(target) and (by_size or any(t.kind == "ident" and BATCH.match(t.text) for t in rhs)):
            yield Hit("SB104", s[0].line, s[0].col, f"`{target}` is computed from a batch-like value", s[-1].line)
