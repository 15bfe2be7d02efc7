"""Compile one Triton kernel for sm_90 (H200) without a GPU and print its PTX: `module:kernel(arg=type, CONST=value)`,
where module is a dotted name to import or a path to a .py file (loaded from there, nothing added to sys.path).

Run as a subprocess by compiled.py, with TRITON_INTERPRET unset, so that @triton.jit yields a compilable kernel (the
interpreter's stand-in has no compiler) and the lint process itself never imports triton.
"""
from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import sys
from pathlib import Path

RUNTIME_TYPE = re.compile(r"^\*?(fp|bf|i|u)\d+$|^\*?fp8\w+$|^\*?i1$")
OPTIONS = ("num_warps", "num_stages")


def parse_spec(spec: str) -> tuple[str, str, dict[str, str], dict[str, object]]:
    """`pkg.mod:kernel(x_ptr=*fp32, BLOCK=128)` -> (module, kernel, {arg: type}, {name: constexpr or option value});
    `dir/file.py:kernel(...)` names the module by its file."""
    m = re.fullmatch(r"\s*([\w.]+|[^:()]+\.py):(\w+)\((.*)\)\s*", spec, re.DOTALL)
    if not m:
        raise ValueError(f"not a kernel spec: {spec!r}; write module:kernel(arg=type, CONST=value, num_warps=4)")
    types, values = {}, {}
    for item in filter(None, (s.strip() for s in m.group(3).split(","))):
        name, _, value = (s.strip() for s in item.partition("="))
        if RUNTIME_TYPE.match(value):
            types[name] = value
        else:
            values[name] = ast.literal_eval(value)
    return m.group(1), m.group(2), types, values


def _load(module: str):
    if not module.endswith(".py"):
        return importlib.import_module(module)
    spec = importlib.util.spec_from_file_location(Path(module).stem, module)
    loaded = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(loaded)
    return loaded


def compile_ptx(spec: str) -> str:
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    module, kernel, types, values = parse_spec(spec)
    fn = getattr(_load(module), kernel)
    options = {k: values.pop(k) for k in OPTIONS if k in values}
    missing = [a for a in fn.arg_names if a not in types and a not in values]
    if missing:
        raise ValueError(f"{module}:{kernel}: give a type or a value for {', '.join(missing)}")
    signature = {a: types.get(a, "constexpr") for a in fn.arg_names}
    source = ASTSource(fn, signature, values)
    return triton.compile(source, target=GPUTarget("cuda", 90, 32), options=options).asm["ptx"]


def main(argv: list[str]) -> int:
    try:
        sys.stdout.write(compile_ptx(argv[0]))
    except Exception as e:  # noqa: BLE001 - the parent reports the one-line reason next to the spec
        print(f"{type(e).__name__}: {e}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
