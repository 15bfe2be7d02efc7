"""A module of this test tree run in a child interpreter as pytest imports it here (`--import-mode=importlib`,
pyproject.toml): `tests` is registered from its own folder, so the checkout's root never goes on the child's sys.path
(a folder there can shadow an installed package: tests/test_import_paths.py)."""
from __future__ import annotations

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent
_BOOT = """
import importlib.util, runpy, sys
spec = importlib.util.spec_from_file_location("tests", {init!r}, submodule_search_locations=[{folder!r}])
sys.modules["tests"] = importlib.util.module_from_spec(spec)
spec.loader.exec_module(sys.modules["tests"])
sys.argv = sys.argv[1:]
runpy.run_module(sys.argv[0], run_name="__main__", alter_sys=True)
""".format(init=str(TESTS / "__init__.py"), folder=str(TESTS))


def module_argv(module: str, *args: str) -> list[str]:
    """argv that runs `python -m module args...` for a module under tests/, e.g. "tests.kernels.cpu_paths_worker"."""
    assert module.startswith("tests."), f"{module} is not a module of this test tree"
    return [sys.executable, "-c", _BOOT, module, *args]
