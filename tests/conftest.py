import os
import random

import pytest
import torch

_CUDA = torch.cuda.is_available()
# Triton runs on the CPU only in its interpreter, and the variable must be set before triton is imported (torch's
# inductor imports it too).
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")
# Child interpreters (`python -m samebits serve`, `-c` scripts) put neither their working directory nor a script's
# folder on sys.path, as the Makefile asks of this one: no folder of the checkout shadows an installed package.
os.environ.setdefault("PYTHONSAFEPATH", "1")

# Imported after the variables above: they import triton, or samebits which may.
from torch._inductor.runtime.cache_dir_utils import cache_dir

from tests import process_state

pytest_plugins = ["pytester"]  # tests/test_process_state.py runs planted tests under the guard below
# torch writes its inductor cache folder into the environment the first time anything asks for it (triton's launchers
# do); asked once here, so that the first test to compile is not taken for one that changed the environment.
cache_dir()


def _enter_the_template_as_serve_does() -> None:
    # MKL fixes its reproducible mode for the process's life at its first computation, and from then on the template
    # leaves MKL_CBWR naming that mode (runtime/template.py). `samebits serve` enters the template before loading; so
    # does the session here, once, before any test computes. Otherwise the first test to run a matmul would pick the
    # mode (an engine's fingerprint, its `mkl_cnr`, would follow the test order: the engine-process test compared a
    # child's AUTO,STRICT with this process's OFF), and the first to enter the template would be taken for a test
    # that set MKL_CBWR.
    from samebits.runtime.template import deterministic_runtime

    with deterministic_runtime():
        pass


_enter_the_template_as_serve_does()


@pytest.fixture(autouse=True, scope="module")
def _module_keeps_process_state(request):
    with process_state.kept(f"module {request.module.__name__} (its fixtures included)"):
        yield


@pytest.fixture(autouse=True)
def _test_keeps_process_state(request):
    with process_state.kept(f"test {request.node.nodeid}"):
        yield


@pytest.fixture(autouse=True)
def _openmp_variables_put_back(_test_keeps_process_state):
    """The GPU image's libraries set Intel OpenMP's KMP_DUPLICATE_LIB_OK and KMP_INIT_AT_FORK the first time a
    transformers model runs (seen on the H200, whichever test comes first): put back before the guard looks."""
    before = {name: os.environ.get(name) for name in ("KMP_DUPLICATE_LIB_OK", "KMP_INIT_AT_FORK")}
    yield
    for name, value in before.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value


def pytest_terminal_summary(terminalreporter, config):
    """The order's seed, also under -q (pytest-randomly's own line is a header, which -q hides)."""
    seed = getattr(config.option, "randomly_seed", None)
    if seed is not None and config.pluginmanager.has_plugin("randomly"):
        terminalreporter.write_line(f"random test order: replay it with --randomly-seed={seed}")


def pytest_collection_modifyitems(config, items):
    if _CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture
def seed(request) -> int:
    """A fresh seed per test (SAMEBITS_TEST_SEED replays one); a failing test's report names it."""
    value = int(os.environ.get("SAMEBITS_TEST_SEED", "0")) or random.SystemRandom().randrange(1, 2**31)
    request.node.user_properties.append(("seed", value))
    return value


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    report = (yield).get_result()
    seeds = [v for k, v in item.user_properties if k == "seed"]
    if report.failed and seeds:
        report.sections.append(("seed", f"replay with SAMEBITS_TEST_SEED={seeds[0]}"))
