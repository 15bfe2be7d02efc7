"""The ops table: every row's backend defines the whole op set, and a device without a row fails loud."""
from __future__ import annotations

import importlib
import inspect

import pytest
import torch

from samebits.kernels import UnsupportedOpError, get_ops
from samebits.kernels.ops import BACKENDS, OPS, OpSet
from samebits.modes import MODES


@pytest.mark.parametrize("row", sorted(BACKENDS))
def test_every_backend_defines_the_whole_op_set(row):
    if ".triton." in BACKENDS[row]:
        pytest.importorskip("triton")
    backend = importlib.import_module(BACKENDS[row])
    assert [op for op in OPS if not callable(getattr(backend, op, None))] == []
    assert get_ops(*row).backend is backend


def test_every_mode_has_a_row_per_device():
    assert sorted(BACKENDS) == sorted((mode, device) for mode in MODES for device in ("cpu", "cuda"))


@pytest.mark.parametrize("mode", MODES)
def test_a_device_without_a_row_fails_loud(mode):
    with pytest.raises(UnsupportedOpError, match="device=meta"):
        get_ops(mode, "meta")


def test_one_shared_instance_per_mode_and_device():
    assert get_ops("fast", "cpu") is get_ops("fast", torch.device("cpu"))
    assert get_ops("fast", "cpu") is not get_ops("deterministic", "cpu")


@pytest.mark.parametrize("row", sorted(BACKENDS))
def test_every_backend_op_takes_the_op_sets_arguments(row):
    """Each backend op accepts the arguments OpSet declares, by position (a torch builtin without a Python signature
    is taken on trust)."""
    if ".triton." in BACKENDS[row]:
        pytest.importorskip("triton")
    backend = importlib.import_module(BACKENDS[row])
    refused = []
    for op in OPS:
        declared = list(inspect.signature(getattr(OpSet, op)).parameters)[1:]  # past self
        try:
            signature = inspect.signature(getattr(backend, op))
        except ValueError:
            continue
        try:
            signature.bind(*declared)
        except TypeError as e:
            refused.append(f"{op}: {e}")
    assert refused == []


def test_a_backend_that_drops_an_argument_is_caught():
    """Negative control of the check above: a linear without the bias does not take OpSet's arguments."""
    declared = list(inspect.signature(OpSet.linear).parameters)[1:]
    with pytest.raises(TypeError):
        inspect.signature(lambda x, weight: x).bind(*declared)
