"""deterministic_runtime(): applies the template, restores what it found, nests, survives exceptions, refuses too late."""
import os
import subprocess
import sys

import pytest
import torch

from samebits.runtime import TEMPLATE_ENV, RuntimeTemplateError, deterministic_runtime, flag_problems, template
from samebits.runtime.template import DETERMINISTIC_FLAGS, _torch_flags

# Variables the template leaves set on exit, because the library read them for the process's life.
KEPT = {"MKL_CBWR"}


@pytest.fixture
def stock(monkeypatch):
    """A process off-template in every flag and variable the template touches, restored afterwards; MKL behaves as
    in a process that has not computed yet (the template's mode can be pinned)."""
    for key in TEMPLATE_ENV:
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setattr(template, "mkl_cnr_pinned", lambda setting: True)
    before = _torch_flags(torch)
    torch.use_deterministic_algorithms(False)
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    torch.set_float32_matmul_precision("high")
    off = _torch_flags(torch)
    yield off
    from samebits.runtime.template import _set_torch_flags

    _set_torch_flags(torch, before)


def test_flags_and_env_applied_inside(stock):
    with deterministic_runtime():
        assert flag_problems() == []
        assert _torch_flags(torch) == DETERMINISTIC_FLAGS
        assert {k: os.environ.get(k) for k in TEMPLATE_ENV} == TEMPLATE_ENV


def test_restored_on_exit(stock):
    with deterministic_runtime():
        pass
    assert _torch_flags(torch) == stock
    assert all(k not in os.environ for k in set(TEMPLATE_ENV) - KEPT)
    assert os.environ["MKL_CBWR"] == TEMPLATE_ENV["MKL_CBWR"], "MKL keeps the pinned mode: the variable says so"


def test_restored_after_exception(stock):
    with pytest.raises(KeyError), deterministic_runtime():
        raise KeyError("boom")
    assert _torch_flags(torch) == stock
    assert all(k not in os.environ for k in set(TEMPLATE_ENV) - KEPT)


def test_mkl_too_late_leaves_its_variable_telling_the_truth(stock, monkeypatch):
    # MKL computed before the template: its mode is fixed, the route proves what it runs, nothing is refused.
    monkeypatch.setattr(template, "mkl_cnr_pinned", lambda setting: False)
    monkeypatch.setenv("MKL_CBWR", "COMPATIBLE")
    with deterministic_runtime():
        assert os.environ["MKL_CBWR"] == "COMPATIBLE"
        assert flag_problems() == []
    assert os.environ["MKL_CBWR"] == "COMPATIBLE"


@pytest.mark.parametrize("exported,pinned", [(None, "AVX2,STRICT"), ("COMPATIBLE,STRICT", "COMPATIBLE,STRICT"),
                                             ("AVX512", "AVX2,STRICT")])
def test_mkl_pins_the_portable_path_when_exported_else_its_own(stock, monkeypatch, exported, pinned):
    asked = []
    monkeypatch.setattr(template, "mkl_cnr_pinned", lambda setting: asked.append(setting) or True)
    if exported:
        monkeypatch.setenv("MKL_CBWR", exported)
    with deterministic_runtime():
        assert os.environ["MKL_CBWR"] == pinned
    assert asked == [pinned]


_MKL_SCRIPT = """
import os, torch
from samebits.kernels.cpu import mkl
from samebits.runtime import deterministic_runtime
if {early}:
    torch.ones(8, 8) @ torch.ones(8, 8)  # MKL computes before the template
with deterministic_runtime():
    inside = os.environ.get("MKL_CBWR")
print(mkl.cnr_mode(), inside, os.environ.get("MKL_CBWR"))
"""


@pytest.mark.parametrize("early", [False, True], ids=["template-first", "matmul-first"])
def test_mkl_mode_pinned_in_a_fresh_process_and_too_late_after_a_matmul(early):
    from samebits.kernels.cpu import mkl

    if not mkl.available():
        pytest.skip("this torch build does not expose MKL's CNR entry points")
    env = {k: v for k, v in os.environ.items() if k != "MKL_CBWR"}
    out = subprocess.run([sys.executable, "-c", _MKL_SCRIPT.format(early=early)], env=env, capture_output=True,
                         text=True, timeout=120, check=True).stdout.split()
    if early:
        assert out == ["OFF", "None", "None"]
    else:
        # AVX2 on Intel; MKL refuses the Intel branches on AMD and runs AUTO with the same strictness there.
        assert out[0] in ("AVX2,STRICT", "AUTO,STRICT") and out[1:] == ["AVX2,STRICT", "AVX2,STRICT"]


def test_nesting_restores_each_level(stock):
    with deterministic_runtime():
        with deterministic_runtime():
            assert _torch_flags(torch) == DETERMINISTIC_FLAGS
        assert _torch_flags(torch) == DETERMINISTIC_FLAGS
        assert os.environ["CUBLAS_WORKSPACE_CONFIG"] == TEMPLATE_ENV["CUBLAS_WORKSPACE_CONFIG"]
    assert _torch_flags(torch) == stock
    assert "CUBLAS_WORKSPACE_CONFIG" not in os.environ


def test_preexisting_env_value_is_put_back(stock, monkeypatch):
    monkeypatch.setenv("NCCL_ALGO", "Tree")
    with deterministic_runtime():
        assert os.environ["NCCL_ALGO"] == "Ring"
    assert os.environ["NCCL_ALGO"] == "Tree"


def test_too_late_raises_with_the_fix(stock, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    with pytest.raises(RuntimeTemplateError) as err, deterministic_runtime():
        pytest.fail("entered although cuBLAS had already started without the workspace config")
    msg = str(err.value)
    assert "CUBLAS_WORKSPACE_CONFIG" in msg and "<unset>" in msg
    assert "samebits env --shell" in msg and "before" in msg
    assert _torch_flags(torch) == stock, "a refused template must leave the process untouched"


def test_too_late_names_a_wrong_value(stock, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", ":0:0")
    with pytest.raises(RuntimeTemplateError, match=":0:0"), deterministic_runtime():
        pass


@pytest.mark.parametrize("value", [":4096:8", ":16:8"])
def test_cuda_already_up_is_fine_when_workspace_was_set(stock, monkeypatch, value):
    monkeypatch.setattr(torch.cuda, "is_initialized", lambda: True)
    monkeypatch.setenv("CUBLAS_WORKSPACE_CONFIG", value)
    with deterministic_runtime():
        assert flag_problems() == []
