"""Inputs the check cannot test: each is one line on stderr and exit code 2, never a traceback."""
from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from samebits.check import run
from tests.check.fake_openai import FakeServer, Flaws


def closed_port_url() -> str:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"http://127.0.0.1:{s.getsockname()[1]}"  # closed when the block ends: nothing listens there


def one_line_exit_2(code: int, capsys) -> str:
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert code == 2, captured
    assert err.startswith("samebits check: error: ") and "\n" not in err and "Traceback" not in err, err
    assert captured.out == ""  # no table for an endpoint that was not tested
    return err


def test_unreachable_url_from_the_command_line():
    proc = subprocess.run([sys.executable, "-m", "samebits.check", closed_port_url(), "--quiet"],
                          check=False, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 2, proc
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("samebits check: error: cannot reach http://127.0.0.1:"), lines
    assert proc.stdout == ""


def test_wrong_api_key(capsys):
    with FakeServer(Flaws(api_key="sk-right")) as url:
        err = one_line_exit_2(run(url, api_key="sk-wrong", quiet=True), capsys)
    assert "refused the API key (HTTP 401" in err and "--api-key" in err


def test_missing_api_key(capsys):
    with FakeServer(Flaws(api_key="sk-right")) as url:
        assert "refused the API key" in one_line_exit_2(run(url, quiet=True), capsys)


def test_model_that_does_not_exist(capsys):
    with FakeServer() as url:
        err = one_line_exit_2(run(url, model="no-such-model", quiet=True), capsys)
    assert "'no-such-model' does not exist" in err and "it serves: fake-model" in err


def test_endpoint_without_logprobs(capsys):
    with FakeServer(Flaws(logprobs=False)) as url:
        err = one_line_exit_2(run(url, quiet=True), capsys)
    assert "returns no logprobs" in err


def test_plan_over_the_request_budget_is_refused_before_the_experiments(capsys):
    fake = FakeServer()
    with fake as url:
        err = one_line_exit_2(run(url, concurrency=(1, 64), max_requests=50, quiet=True), capsys)
    assert "need" in err and "more than --max-requests 50" in err
    assert fake.state.requests == 1  # the preflight's probe only (GET /models is not counted by the fake)


@pytest.mark.parametrize("options, needle", [
    ({"experiments": ("needle", "bogus")}, "experiments must be a non-empty subset"),
    ({"concurrency": (4, 1)}, "concurrency must be increasing"),
    ({"url_typo": 1}, "unexpected keyword argument 'url_typo'"),
])
def test_bad_options(options, needle, capsys):
    assert needle in one_line_exit_2(run("http://127.0.0.1:9", quiet=True, **options), capsys)


def test_unwritable_report_path_fails_before_any_request(tmp_path, capsys):
    err = one_line_exit_2(run("http://127.0.0.1:9", json_path=tmp_path / "missing" / "r.json", quiet=True), capsys)
    assert "cannot write" in err


def test_compare_with_a_file_that_is_not_a_report(tmp_path, capsys):
    bad = tmp_path / "r.json"
    bad.write_text("{}")
    assert "is not a samebits check report" in one_line_exit_2(run("http://127.0.0.1:9", compare=bad, quiet=True),
                                                              capsys)
