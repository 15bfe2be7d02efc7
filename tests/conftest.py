import os

import pytest

# Triton runs on the CPU only in its interpreter, and the variable must be set before triton is imported.
try:
    import torch

    _CUDA = torch.cuda.is_available()
except Exception:  # pragma: no cover - torch is a core dependency
    _CUDA = False
if not _CUDA:
    os.environ.setdefault("TRITON_INTERPRET", "1")


def pytest_collection_modifyitems(config, items):
    if _CUDA:
        return
    skip = pytest.mark.skip(reason="needs CUDA")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
