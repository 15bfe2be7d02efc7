"""The ops table: every row's backend defines the whole op set, and a device without a row fails loud."""
from __future__ import annotations

import importlib

import pytest
import torch

from samebits.kernels import UnsupportedOpError, get_ops
from samebits.kernels.ops import BACKENDS, OPS
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
