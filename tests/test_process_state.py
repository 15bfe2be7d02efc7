"""tests/process_state.py, the guard every test runs under (tests/conftest.py), and its negative controls: planted
tests that leave state behind fail, name what they left, and leave nothing for the next test."""
from __future__ import annotations

import os

import torch

from tests import process_state

_CONFTEST = '''
import pytest
from tests import process_state

@pytest.fixture(autouse=True)
def _kept(request):
    with process_state.kept(f"test {request.node.nodeid}"):
        yield
'''
_PLANTED = '''
import os
import torch

def test_leaves_a_variable_set():
    os.environ["SAMEBITS_PLANTED_LEAK"] = "1"

def test_leaves_the_default_dtype_changed():
    torch.set_default_dtype(torch.float64)

def test_restores_what_it_changes(monkeypatch):
    monkeypatch.setenv("SAMEBITS_PLANTED_KEPT", "1")
    monkeypatch.syspath_prepend(os.getcwd())
'''


def test_negative_control_leaking_tests_fail_and_are_put_back(pytester):
    pytester.makeconftest(_CONFTEST)
    pytester.makepyfile(test_planted=_PLANTED)
    result = pytester.runpytest_inprocess("-p", "no:randomly", "-p", "no:cacheprovider", "--import-mode=importlib")
    result.assert_outcomes(passed=3, errors=2)
    result.stdout.fnmatch_lines(["*test_leaves_a_variable_set*os.environ: SAMEBITS_PLANTED_LEAK*",
                                 "*test_leaves_the_default_dtype_changed*torch.float32 -> torch.float64*"])
    assert "SAMEBITS_PLANTED_LEAK" not in os.environ and torch.get_default_dtype() == torch.float32


def test_changes_names_each_fact_that_moved():
    before = process_state.snapshot()
    after = {**before, "os.environ": {**before["os.environ"], "X": "1"}, "torch threads": before["torch threads"] + 1}
    assert process_state.changes(before, after) == [
        "os.environ: X", f"torch threads: {before['torch threads']!r} -> {before['torch threads'] + 1!r}"]
    assert process_state.changes(before, process_state.snapshot()) == []
