"""Python rules (Triton SB2xx, PyTorch SB3xx) on the ast; comments come from tokenize, so strings never suppress."""
from __future__ import annotations

import ast
import io
import re
import tokenize
from collections.abc import Iterator

from samebits.lint.findings import Finding
from samebits.lint.hits import Hit, findings
from samebits.lint.names import BATCH, GRID_TARGET, SM_NAME, SPLIT
from samebits.lint.suppress import Comment

REDUCING = {"dot", "sum", "reduce", "cumsum", "cumprod", "associative_scan", "dot_scaled", "xor_sum"}
TRITON_ATOMICS = {"atomic_add": 1, "atomic_xchg": 1, "atomic_cas": 2}  # op -> position of the stored value
INT_DTYPES = re.compile(r"\b(u?int(8|16|32|64)|bool|int1)\b")
# Sampling draws only: randn/rand/randint make test data and weights far more often than they pick tokens.
RNG_FUNCS = {"multinomial", "bernoulli", "poisson"}
RNG_METHODS = {"multinomial", "bernoulli", "bernoulli_", "exponential_", "geometric_"}
SEEDERS = {"torch.manual_seed", "torch.random.manual_seed", "torch.cuda.manual_seed", "torch.cuda.manual_seed_all"}
REDUCED_FLAGS = {"allow_tf32", "allow_bf16_reduced_precision_reduction", "allow_fp16_reduced_precision_reduction"}
ENTRY_FLAGS = ("allow_bf16_reduced_precision_reduction", "cudnn.allow_tf32")
CUBLAS = "CUBLAS_WORKSPACE_CONFIG"


def check_python(path: str, source: str) -> list[Finding]:
    tree = ast.parse(source, filename=path)
    mod = _Module(tree)
    hits = [*_triton_atomics(mod), *_autotune_keys(mod), *_splits_from_batch(mod), *_sm_count_grids(mod),
            *_torch_atomics(mod), *_entry_points(mod), *_reduced_precision(mod), *_cublas_env(mod),
            *_global_generator(mod)]
    return findings(path, hits, _comments(source))


def _comments(source: str) -> list[Comment]:
    out = []
    lines = source.splitlines()
    for tok in tokenize.generate_tokens(io.StringIO(source).readline):
        if tok.type == tokenize.COMMENT:
            (row, col), text = tok.start, tok.string
            out.append(Comment(row, row, col, text, not lines[row - 1][:col].strip()))
    return out


class _Module:
    """What the rules ask of a module: import aliases, and the dotted name a call or attribute resolves to."""

    def __init__(self, tree: ast.Module):
        self.tree = tree
        self.nodes = list(ast.walk(tree))
        self.aliases: dict[str, str] = {}
        self.torch_imports: list[ast.stmt] = []
        for node in self.nodes:
            if isinstance(node, ast.Import):
                for a in node.names:
                    self.aliases[a.asname or a.name.split(".")[0]] = a.name if a.asname else a.name.split(".")[0]
                    self._note_torch(node, a.name)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for a in node.names:
                    self.aliases[a.asname or a.name] = f"{node.module}.{a.name}"
                self._note_torch(node, node.module)

    def _note_torch(self, node: ast.stmt, name: str) -> None:
        if name == "torch" or name.startswith("torch."):
            self.torch_imports.append(node)

    def qualname(self, node: ast.AST) -> str:
        if isinstance(node, ast.Name):
            return self.aliases.get(node.id, node.id)
        if isinstance(node, ast.Attribute):
            return f"{self.qualname(node.value)}.{node.attr}"
        if isinstance(node, ast.Call):
            return self.qualname(node.func) + "()"
        return "?"

    def calls(self) -> Iterator[ast.Call]:
        return (n for n in self.nodes if isinstance(n, ast.Call))


def _hit(rule: str, node: ast.AST, message: str) -> Hit:
    return Hit(rule, node.lineno, node.col_offset + 1, message, getattr(node, "end_lineno", node.lineno))


def _arg(call: ast.Call, pos: int, kw: str) -> ast.expr | None:
    for k in call.keywords:
        if k.arg == kw:
            return k.value
    return call.args[pos] if len(call.args) > pos else None


def _const(node: ast.AST | None):
    return node.value if isinstance(node, ast.Constant) else None


def _functions(mod: _Module) -> Iterator[ast.FunctionDef | ast.AsyncFunctionDef]:
    return (n for n in mod.nodes if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)))


def _scope_nodes(scope: ast.AST) -> Iterator[ast.AST]:
    """The nodes of one scope, not those of functions defined inside it (they are scopes of their own)."""
    todo = list(ast.iter_child_nodes(scope))
    while todo:
        node = todo.pop()
        yield node
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            todo.extend(ast.iter_child_nodes(node))


def _names_in(node: ast.AST) -> set[str]:
    return {n.id for n in ast.walk(node) if isinstance(n, ast.Name)}


# --- Triton ---------------------------------------------------------------------------------------------------------

def _is_triton_atomic(mod: _Module, call: ast.Call) -> str | None:
    name = mod.qualname(call.func)
    op = name.rsplit(".", 1)[-1]
    if op in TRITON_ATOMICS and name.startswith(("triton.language.", "tl.")):
        return op
    return None


def _int_names(mod: _Module, fn: ast.AST) -> set[str]:
    """Names a function binds to integer-evident values, to a fixed point (x = 1; y = x * 2); parameters annotated
    with an integer type (`size: tl.uint64`) among them."""
    args = fn.args.args if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
    known = {a.arg for a in args if a.annotation is not None and INT_DTYPES.search(mod.qualname(a.annotation))}
    assigns = [n for n in ast.walk(fn) if isinstance(n, ast.Assign)]
    changed = True
    while changed:
        changed = False
        for a in assigns:
            if _is_int(mod, a.value, known):
                for t in a.targets:
                    if isinstance(t, ast.Name) and t.id not in known:
                        known.add(t.id)
                        changed = True
    return known


def _is_int(mod: _Module, node: ast.AST | None, known: set[str]) -> bool:
    if isinstance(node, ast.Constant):
        return isinstance(node.value, (bool, int))
    if isinstance(node, ast.Name):
        return node.id in known
    if isinstance(node, ast.BinOp):
        return _is_int(mod, node.left, known) and _is_int(mod, node.right, known)
    if isinstance(node, ast.UnaryOp):
        return _is_int(mod, node.operand, known)
    if isinstance(node, ast.Call):
        name = mod.qualname(node.func)
        if name.endswith((".arange", ".program_id", ".num_programs")):
            return True
        dtype = _dtype_of(name, node)
        return dtype is not None and bool(INT_DTYPES.search(mod.qualname(dtype)))
    return False


def _dtype_of(name: str, call: ast.Call) -> ast.expr | None:
    """The dtype argument of x.to(dtype), tl.full(shape, value, dtype), tl.zeros(shape, dtype) and the like."""
    if name.endswith(".to"):
        return _arg(call, 0, "dtype")
    if name.endswith(".full"):
        return _arg(call, 2, "dtype")
    if name.endswith((".zeros", ".ones", ".empty")):
        return _arg(call, 1, "dtype")
    return next((k.value for k in call.keywords if k.arg == "dtype"), None)


def _float_names(mod: _Module, fn: ast.AST) -> set[str]:
    known: set[str] = set()
    for a in sorted((n for n in ast.walk(fn) if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
        if _is_float(mod, a.value, known):
            known |= {t.id for t in a.targets if isinstance(t, ast.Name)}
    return known


def _is_float(mod: _Module, node: ast.AST | None, known: set[str]) -> bool:
    """Float-evident: a float literal, a cast to a float dtype, a float tensor made in place, or an expression of
    names bound to one."""
    for n in ast.walk(node) if node is not None else ():
        if isinstance(n, ast.Constant) and isinstance(n.value, float) or isinstance(n, ast.Name) and n.id in known:
            return True
        if isinstance(n, ast.Call):
            dtype = _dtype_of(mod.qualname(n.func), n)
            if dtype is not None and re.search(r"\b(b?float|fp)\d+", mod.qualname(dtype)):
                return True
    return False


def _triton_atomics(mod: _Module) -> Iterator[Hit]:
    for fn in [mod.tree, *_functions(mod)]:
        atomics = [(c, op) for c in _scope_nodes(fn) if isinstance(c, ast.Call) and (op := _is_triton_atomic(mod, c))]
        ints = _int_names(mod, fn) if atomics else set()
        floats = _float_names(mod, fn) if atomics else set()
        for call, op in atomics:
            value = _arg(call, TRITON_ATOMICS[op], "val")
            # An add of anything not known to be an integer accumulates; xchg/cas mostly move flags, so only a
            # value known to be a float counts there.
            if _is_float(mod, value, floats) if op != "atomic_add" else not _is_int(mod, value, ints):
                yield _hit("SB201", call, f"tl.{op} on a value not known to be an integer")


def _reduces(fn: ast.AST) -> bool:
    for n in ast.walk(fn):
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr in REDUCING:
            return True
        if isinstance(n, ast.For) and any(isinstance(a, ast.AugAssign) and isinstance(a.op, ast.Add)
                                          for a in ast.walk(n)):
            return True
    return False


def _autotune_keys(mod: _Module) -> Iterator[Hit]:
    for fn in _functions(mod):
        for dec in fn.decorator_list:
            if not (isinstance(dec, ast.Call) and mod.qualname(dec.func).endswith("autotune")):
                continue
            key = _arg(dec, 1, "key")
            names = [_const(e) for e in key.elts] if isinstance(key, (ast.List, ast.Tuple)) else []
            batch = [k for k in names if isinstance(k, str) and BATCH.match(k)]
            if batch and _reduces(fn):
                yield _hit("SB202", dec, f"autotune key {batch} is batch-like and {fn.name} reduces")


def _mentions_batch(node: ast.AST) -> bool:
    for n in ast.walk(node):
        if isinstance(n, ast.Name) and BATCH.match(n.id):
            return True
        if isinstance(n, ast.Attribute) and BATCH.match(n.attr):
            return True
        if isinstance(n, ast.Subscript):
            idx = _const(n.slice)
            if isinstance(idx, str) and BATCH.match(idx):
                return True  # args["M"] in a heuristics lambda
            if idx == 0 and isinstance(n.value, ast.Attribute) and n.value.attr == "shape":
                return True
        if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "size" and \
                _const(_arg(n, 0, "dim")) == 0:
            return True
    return False


def _is_tensor_split(node: ast.AST) -> bool:
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and \
        node.func.attr in {"split", "chunk", "tensor_split"}


def _split_bindings(mod: _Module) -> Iterator[tuple[str, ast.AST, ast.AST]]:
    """(name, value, node) for every binding of a split-named value: assignments, keywords, dict keys."""
    for n in mod.nodes:
        if isinstance(n, (ast.Assign, ast.AnnAssign)) and n.value is not None:
            for t in n.targets if isinstance(n, ast.Assign) else [n.target]:
                name = t.id if isinstance(t, ast.Name) else t.attr if isinstance(t, ast.Attribute) else ""
                yield name, n.value, n
        elif isinstance(n, ast.keyword) and n.arg:
            yield n.arg, n.value, n.value
        elif isinstance(n, ast.Dict):
            for k, v in zip(n.keys, n.values):
                if isinstance(_const(k), str):
                    yield k.value, v, v


def _splits_from_batch(mod: _Module) -> Iterator[Hit]:
    for name, value, node in _split_bindings(mod):
        if SPLIT.search(name) and not _is_tensor_split(value) and _mentions_batch(value):
            yield _hit("SB203", node, f"`{name}` is computed from a batch-like value")


def _is_sm_source(node: ast.AST) -> bool:
    if isinstance(node, ast.Name):
        return bool(SM_NAME.match(node.id))
    if isinstance(node, ast.Attribute):
        return bool(SM_NAME.match(node.attr))
    if isinstance(node, ast.Subscript):
        idx = _const(node.slice)
        return isinstance(idx, str) and bool(SM_NAME.match(idx))
    return False


def _tainted(node: ast.AST, taint: set[str]) -> bool:
    return any(_is_sm_source(n) or isinstance(n, ast.Name) and n.id in taint for n in ast.walk(node))


def _loads(node: ast.AST) -> bool:
    return any(isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute) and n.func.attr == "load"
               for n in ast.walk(node))


def _sm_taint(nodes: list[ast.AST]) -> set[str]:
    """Names computed from the SM count; a value loaded from memory is data, even at an address derived from it."""
    taint: set[str] = set()
    for _ in range(3):  # a chain of three assignments deep is as far as a grid computation goes in practice
        for a in nodes:
            if isinstance(a, ast.Assign) and _tainted(a.value, taint) and not _loads(a.value):
                taint |= {n.id for t in a.targets for n in ast.walk(t) if isinstance(n, ast.Name)}
    return taint


def _sm_count_grids(mod: _Module) -> Iterator[Hit]:
    for scope in [mod.tree, *_functions(mod)]:
        nodes = list(_scope_nodes(scope))
        if not any(_is_sm_source(n) for n in nodes):
            continue
        taint = _sm_taint(nodes)
        for n in sorted((n for n in nodes if isinstance(n, ast.Assign)), key=lambda n: n.lineno):
            if _tainted(n.value, taint) and any(isinstance(t, ast.Name) and GRID_TARGET.search(t.id)
                                                for t in n.targets):
                yield _hit("SB204", n, "grid or split derived from the SM count")
                taint -= {t.id for t in n.targets if isinstance(t, ast.Name)}  # its launch is not reported again
        for n in (n for n in nodes if isinstance(n, ast.Call)):
            if mod.qualname(n.func).split(".")[-1] in {"range", "static_range"}:
                if any(_tainted(a, taint) for a in n.args):
                    yield _hit("SB204", n, "loop bound derived from the SM count")
            elif isinstance(n.func, ast.Subscript) and _tainted(n.func.slice, taint):
                yield _hit("SB204", n, "launch grid derived from the SM count")


# --- PyTorch --------------------------------------------------------------------------------------------------------

def _no_grad_lines(mod: _Module) -> set[int]:
    """Lines inside `with torch.no_grad()/inference_mode()` or a function decorated with them: no backward there."""
    lines: set[int] = set()
    for n in mod.nodes:
        ctx = [i.context_expr for i in n.items] if isinstance(n, ast.With) else \
            n.decorator_list if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef)) else []
        if any(mod.qualname(c).removesuffix("()").endswith(("no_grad", "inference_mode")) for c in ctx):
            lines.update(range(n.lineno, n.end_lineno + 1))
    return lines


def _torch_atomic(mod: _Module, call: ast.Call, no_grad: set[int]) -> str | None:
    if not isinstance(call.func, ast.Attribute):
        return None
    op, func_form = call.func.attr, mod.qualname(call.func).startswith("torch.")
    if op in {"index_add_", "index_add", "scatter_add_", "scatter_add", "index_reduce_", "index_reduce"}:
        return op
    if op in {"scatter_reduce_", "scatter_reduce"}:
        reduce = _const(_arg(call, 4 if func_form else 3, "reduce"))
        return None if reduce in ("amax", "amin") else op
    if op in {"index_put_", "index_put", "put_", "put"}:
        return f"{op}(accumulate=True)" if _const(_arg(call, 3 if func_form else 2, "accumulate")) is True else None
    if op == "bincount":
        return "bincount(weights)" if _arg(call, 1 if func_form else 0, "weights") is not None else None
    if op == "histc":
        return op
    if op in {"embedding_bag", "EmbeddingBag"} and call.lineno not in no_grad:
        return f"{op} (backward)"
    return None


def _torch_atomics(mod: _Module) -> Iterator[Hit]:
    no_grad = _no_grad_lines(mod)
    for call in mod.calls():
        op = _torch_atomic(mod, call, no_grad)
        if op:
            yield _hit("SB301", call, f"{op} accumulates with float atomics on CUDA")


def _main_guard(mod: _Module) -> ast.If | None:
    for n in mod.tree.body:
        if isinstance(n, ast.If) and isinstance(n.test, ast.Compare) and isinstance(n.test.left, ast.Name) and \
                n.test.left.id == "__name__" and _const(n.test.comparators[0]) == "__main__":
            return n
    return None


def _assigned_flags(mod: _Module) -> set[str]:
    """Dotted tails (`cudnn.allow_tf32`) of the backend flags the module sets to something other than True."""
    out = set()
    for n in mod.nodes:
        if isinstance(n, ast.Assign) and _const(n.value) is not True:
            out |= {mod.qualname(t) for t in n.targets if isinstance(t, ast.Attribute)}
    return out


def _entry_points(mod: _Module) -> Iterator[Hit]:
    guard = _main_guard(mod)
    if guard is None or not mod.torch_imports:
        return
    det = [c for c in mod.calls() if mod.qualname(c.func).endswith("use_deterministic_algorithms")]
    if not any(_const(_arg(c, 0, "mode")) is not False for c in det):
        yield _hit("SB302", guard.test, "entry point never calls torch.use_deterministic_algorithms(True)")
    flags = _assigned_flags(mod)
    missing = [f for f in ENTRY_FLAGS if not any(q.endswith(f) for q in flags)]
    if missing:
        yield _hit("SB304", guard.test, f"entry point leaves {', '.join(missing)} at the default (on)")


def _reduced_precision(mod: _Module) -> Iterator[Hit]:
    for n in mod.nodes:
        if isinstance(n, ast.Assign) and any(isinstance(t, ast.Attribute) for t in n.targets):
            attrs = [t.attr for t in n.targets if isinstance(t, ast.Attribute)]
            if (_const(n.value) is True and REDUCED_FLAGS & set(attrs)) or \
                    ("fp32_precision" in attrs and _const(n.value) == "tf32"):
                yield _hit("SB303", n, f"{attrs[0]} turned on")
        elif isinstance(n, ast.Call) and mod.qualname(n.func).endswith("set_float32_matmul_precision") and \
                _const(_arg(n, 0, "precision")) in ("high", "medium"):
            yield _hit("SB303", n, "float32 matmul precision below 'highest' allows TF32/bf16 passes")


def _sets_cublas(mod: _Module, n: ast.AST) -> bool:
    if isinstance(n, ast.Assign):
        return any(isinstance(t, ast.Subscript) and _const(t.slice) == CUBLAS and
                   mod.qualname(t.value).endswith("environ") for t in n.targets)
    if isinstance(n, ast.Call):
        name = mod.qualname(n.func)
        if name.endswith(("environ.setdefault", "putenv")):
            return _const(_arg(n, 0, "key")) == CUBLAS
        if name.endswith("environ.update"):
            d = n.args[0] if n.args else None
            return any(k.arg == CUBLAS for k in n.keywords) or isinstance(d, ast.Dict) and any(
                _const(k) == CUBLAS for k in d.keys)
    return False


def _cublas_env(mod: _Module) -> Iterator[Hit]:
    if not mod.torch_imports:
        return
    sets = [n for n in mod.nodes if _sets_cublas(mod, n)]
    if not sets:
        return
    top_level = any(n in mod.tree.body for n in mod.torch_imports)
    first = min(n.lineno for n in mod.torch_imports)
    in_functions = {id(x) for f in _functions(mod) for x in ast.walk(f)}
    for n in sets:
        if n.lineno > first or top_level and id(n) in in_functions:
            yield _hit("SB305", n, f"{CUBLAS} set after torch is imported (line {first})")


def _is_global_draw(mod: _Module, call: ast.Call) -> bool:
    if any(k.arg == "generator" for k in call.keywords):
        return False
    name = mod.qualname(call.func)
    if name.startswith("torch.") and name.rsplit(".", 1)[-1] in RNG_FUNCS and name.count(".") == 1:
        return True
    return isinstance(call.func, ast.Attribute) and call.func.attr in RNG_METHODS and not name.startswith("torch.")


def _global_generator(mod: _Module) -> Iterator[Hit]:
    seeds = [c for c in mod.calls() if mod.qualname(c.func) in SEEDERS]
    if not seeds:
        return
    for call in mod.calls():
        if _is_global_draw(mod, call):
            yield _hit("SB306", call, f"draws from the global generator seeded at line {seeds[0].lineno}; "
                                      "no generator= of its own")
