import os
import random

import pytest

# Triton runs on the CPU only in its interpreter, and the variable must be set before triton is imported.
try:
    import torch

    _CUDA = torch.cuda.is_available()
except ImportError:  # pragma: no cover - torch is a core dependency
    _CUDA = False
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def _pin_mkl_as_serve_does() -> None:
    # MKL fixes its reproducible mode for the process's life at its first computation. `samebits serve` pins the
    # template's before loading (runtime/template.py); so does the session here, before any test computes. Otherwise
    # the first test to run a matmul picks the mode, and an engine's fingerprint (its `mkl_cnr`) would follow the test
    # order: the engine-process test compared a child's AUTO,STRICT with this process's OFF.
    from samebits.runtime.template import mkl_cnr_pinned, mkl_setting_for

    mkl_cnr_pinned(mkl_setting_for(os.environ.get("MKL_CBWR")))


_pin_mkl_as_serve_does()


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
