"""No folder that this checkout puts on an import path holds a module whose name another package answers to.

It happened: a benchmark put `benchmarks/` on sys.path, so its `kernels.py` became the `kernels` that transformers
imports when `importlib.util.find_spec("kernels")` finds one, and 53 later tests failed by their order. Now the
benchmarks live in the package (`python -m samebits.benchmarks.NAME`), pytest imports with importlib and python runs
with PYTHONSAFEPATH (Makefile, tests/conftest.py), and nothing in the checkout edits sys.path."""
from __future__ import annotations

import ast
import importlib.metadata
import site
import sys
import sysconfig
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
# Names that folders of scripts, tests and benchmarks tend to hold and that PyPI distributions (or the broken wheels
# that ship such top-level folders) also use.
WELL_KNOWN = {"benchmarks", "common", "conftest", "docs", "e2e", "examples", "helpers", "kernels", "scripts", "test",
              "tests", "tools", "utils"}
OURS = "samebits"


def top_level_names(folder: Path) -> set[str]:
    """What `import NAME` finds in `folder`: modules, packages and namespace packages."""
    names = set()
    for p in folder.iterdir() if folder.is_dir() else ():
        if p.suffix in (".py", ".pyc") or p.name.endswith(".so"):
            names.add(p.name.split(".")[0])
        elif p.is_dir() and p.name.isidentifier():
            names.add(p.name)
    return names


def shadowing(folders: list[Path]) -> dict[str, str]:
    """{'folder/name': why} for each name in `folders` that an installed distribution or WELL_KNOWN also claims."""
    installed = importlib.metadata.packages_distributions()
    found = {}
    for folder in folders:
        for name in sorted(top_level_names(folder)):
            owners = sorted(set(installed.get(name, ())) - {OURS})
            if owners or name in WELL_KNOWN:
                why = f"installed distribution {', '.join(owners)}" if owners else "a well-known name"
                found[f"{folder}/{name}"] = why
    return found


def _interpreter_folders() -> set[Path]:
    paths = sysconfig.get_paths()
    own = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib")} | set(site.getsitepackages())
    return {Path(p).resolve() for p in own} | {Path(sys.prefix, "lib", f"python{sys.version_info[0]}"
                                                                       f"{sys.version_info[1]}.zip").resolve()}


def added_folders(path: list[str]) -> list[Path]:
    """The entries of `path` that the interpreter did not put there itself (a script's folder, PYTHONPATH, an edit)."""
    own = _interpreter_folders()
    return [Path(e or ".").resolve() for e in path
            if Path(e or ".").resolve() not in own and not Path(e or ".").resolve().is_relative_to(sys.base_prefix)]


def test_nothing_on_the_path_shadows_an_installed_package():
    assert shadowing(added_folders(sys.path)) == {}


def test_no_folder_of_the_checkout_is_on_the_path():
    inside = [p for p in added_folders(sys.path) if p.is_relative_to(ROOT)]
    assert inside == [], "pytest or python put the checkout on sys.path: importlib mode and PYTHONSAFEPATH are off?"


def test_the_editable_install_maps_only_samebits():
    """setuptools' editable finder maps names to folders one by one (unlike a path entry): ours alone."""
    finders = [m for name, m in sys.modules.items() if name.startswith(f"__editable___{OURS}")]
    if not finders:
        pytest.skip("samebits is not an editable install here")
    assert {name for f in finders for name in getattr(f, "MAPPING", {})} == {OURS}


def test_a_script_run_by_its_path_brings_no_shadowing_folder():
    """`python scripts/x.py` without PYTHONSAFEPATH puts scripts/ first on sys.path."""
    assert shadowing([ROOT / "scripts"]) == {}


def test_negative_control_a_planted_folder_with_kernels_py_is_caught(tmp_path, monkeypatch):
    (tmp_path / "kernels.py").write_text("CUDAProperties = None\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    found = shadowing(added_folders(sys.path))
    assert list(found) == [f"{tmp_path.resolve()}/kernels"], found
    # The distribution transformers imports, when installed (transformers 5 depends on it), is named as the owner.
    if "kernels" in importlib.metadata.packages_distributions():
        assert "installed distribution" in found[f"{tmp_path.resolve()}/kernels"]


def _restores(node: ast.Assign) -> bool:
    """`sys.path[:] = saved` or `sys.path = saved["path"]`: the whole list put back from a snapshot taken before a
    library changed it (fleet/cluster.py after Ray's import), not a folder added."""
    whole = all(ast.unparse(t) in ("sys.path", "sys.path[:]") for t in node.targets)
    return whole and isinstance(node.value, (ast.Name, ast.Subscript, ast.Attribute))


def sys_path_edits(source: str, filename: str = "<source>") -> list[str]:
    """'file:line' for each statement that adds to or changes sys.path, or adds a site folder."""
    hits = []
    for node in ast.walk(ast.parse(source, filename)):
        target = None
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            if node.func.attr in ("insert", "append", "extend", "remove", "pop", "clear"):
                target = node.func.value
            elif node.func.attr == "addsitedir":
                hits.append(f"{filename}:{node.lineno}")
        elif isinstance(node, ast.Assign) and not _restores(node) or isinstance(node, ast.AugAssign):
            for t in node.targets if isinstance(node, ast.Assign) else [node.target]:
                target = t.value if isinstance(t, ast.Subscript) else t
        if target is not None and ast.unparse(target) == "sys.path":
            hits.append(f"{filename}:{node.lineno}")
    return hits


def _checkout_sources() -> list[Path]:
    skip = {".git", ".venv", ".venv-latest", "build", "lint_corpus"}
    return [p for p in ROOT.rglob("*.py") if not skip & set(p.relative_to(ROOT).parts)]


def test_nothing_in_the_checkout_edits_sys_path():
    edits = [hit for p in _checkout_sources() for hit in sys_path_edits(p.read_text(), str(p))]
    assert edits == []


@pytest.mark.parametrize("line", ["sys.path.insert(0, 'benchmarks')", "sys.path[:0] = ['.', 'benchmarks']",
                                  "sys.path += ['x']", "sys.path = ['x']", "site.addsitedir('x')",
                                  "sys.path.append(str(ROOT))", "sys.path[:0] = saved", "sys.path = saved + ['x']"])
def test_negative_control_each_kind_of_edit_is_found(line):
    assert sys_path_edits(f"import site, sys\n{line}\n") == ["<source>:2"]


@pytest.mark.parametrize("line", ["sys.path[:] = saved", "sys.path[:] = before['path']", "sys.path = state.path"])
def test_putting_back_a_snapshot_is_not_an_edit(line):
    assert sys_path_edits(f"import sys\n{line}\n") == []
