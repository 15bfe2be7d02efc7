"""`samebits probe` end to end through the CLI: outputs written, bad input answered in one line."""
import json

import pytest
import torch
from typer.testing import CliRunner

from samebits.cli import app
from samebits.probe import probes
from tests.probe.test_probes import TINY


@pytest.fixture(autouse=True)
def tiny_sizes(monkeypatch):
    monkeypatch.setattr(probes, "DEFAULT", TINY)


def run(*args):
    return CliRunner().invoke(app, ["probe", *args], terminal_width=200)


def assert_one_line_error(res, *words):
    assert res.exit_code != 0
    assert res.exception is None or isinstance(res.exception, SystemExit), repr(res.exception)
    lines = [ln for ln in res.output.splitlines() if ln.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), res.output
    assert all(w in lines[0] for w in words), lines[0]


def test_probe_writes_json_and_plot(tmp_path):
    js, png = tmp_path / "probe.json", tmp_path / "probe.png"
    res = run("--only", "fp32_associativity,rms_norm_batch", "--json", str(js), "--plot", str(png))
    assert res.exit_code == 0, res.output
    report = json.loads(js.read_text())
    assert report["device"] == "cpu" and report["full"] is False and report["fingerprint"]["hash"]
    assert {p["name"] for p in report["probes"]} == {"fp32_associativity", "rms_norm_batch"}
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert "fp32_associativity" in res.output and "VARIANT" in res.output


def test_unknown_device():
    assert_one_line_error(run("--device", "tpu", "--only", "fp32_associativity"), "tpu")


def test_unsupported_device():
    assert_one_line_error(run("--device", "meta", "--only", "fp32_associativity"), "meta")


@pytest.mark.skipif(torch.cuda.is_available(), reason="this machine has CUDA")
def test_cuda_without_cuda():
    assert_one_line_error(run("--device", "cuda", "--only", "fp32_associativity"), "CUDA is not available")


def test_unknown_probe_names_the_known_ones():
    assert_one_line_error(run("--only", "matmul_batch,nope"), "nope", "matmul_batch", "model_greedy")


def test_empty_only_list():
    assert_one_line_error(run("--only", " , "))


@pytest.mark.parametrize("flag", ["--json", "--plot"])
def test_unwritable_output_fails_before_probing(tmp_path, flag, monkeypatch):
    monkeypatch.setattr(probes, "iter_probes", lambda *a, **k: pytest.fail("probed before checking the output path"))
    blocker = tmp_path / "a_file"
    blocker.write_text("")
    assert_one_line_error(run("--only", "fp32_associativity", flag, str(blocker / "out")), str(blocker))
    assert_one_line_error(run("--only", "fp32_associativity", flag, str(tmp_path)), "directory")
    assert_one_line_error(run("--only", "fp32_associativity", flag, str(tmp_path / "no" / "x")), "no directory")


def test_write_failure_after_probing_is_one_line(tmp_path, monkeypatch):
    from samebits.probe import report

    def refuse(*_):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(report, "write_json", refuse)
    res = run("--only", "fp32_associativity", "--json", str(tmp_path / "x.json"))
    assert res.exit_code != 0 and "Traceback" not in res.output
    assert res.output.splitlines()[-1].startswith("error:") and "Permission denied" in res.output


def test_error_cells_make_the_command_fail(tmp_path, monkeypatch):
    from samebits.probe.impls import VendorOps

    def broken(self, *a, **k):
        raise ZeroDivisionError("tile")

    monkeypatch.setattr(VendorOps, "rms_norm", broken)
    js = tmp_path / "p.json"
    res = run("--only", "rms_norm_batch", "--json", str(js))
    assert res.exit_code == 1 and "ERROR" in res.output
    assert res.output.splitlines()[-1].startswith("error: 1 probe cell")
    assert [p["verdict"] for p in json.loads(js.read_text())["probes"]] == ["error", "invariant"]
