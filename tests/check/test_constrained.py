"""samebits check --constrained: every request carries a grammar (a function of its prompt), so a server whose masks
follow the batch is reported variant (the negative control: the union of the batch's masks), and samebits' own
row-local masks are clean."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from samebits.check import run
from samebits.check.constrained import constraint_fields
from tests.structured.helpers import share_masks_across_the_batch

pytest.importorskip("fastapi")
SHAPES = {"concurrency": (1, 4, 8), "trials": 2, "max_tokens": 8, "needle_words": 8, "filler_words": (2, 12),
          "experiments": ("needle", "sampled"), "quiet": True}


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    from samebits.models.synthetic import write_tiny_checkpoint
    from tests.server.conftest import make_engine, start_server

    live = start_server(make_engine(write_tiny_checkpoint(tmp_path_factory.mktemp("tiny"), "llama3", seed=0)))
    yield live
    live.stop()


def checked(url: str, tmp_path: Path, seed: int, constrained: str) -> tuple[int, dict]:
    path = tmp_path / "report.json"
    code = run(url, json_path=path, seed=seed, constrained=constrained, **SHAPES)
    return code, json.loads(path.read_text())


def test_a_constraint_is_a_function_of_the_prompt():
    assert constraint_fields("none", "a b") == {}
    assert constraint_fields("json", "a b")["response_format"]["type"] == "json_schema"
    kinds = {json.dumps(constraint_fields("mixed", f"prompt {i}")) for i in range(40)}
    assert len(kinds) == 4 and constraint_fields("mixed", "x y") == constraint_fields("mixed", "x y")


def test_row_local_masks_are_clean(server, tmp_path, seed):
    code, report = checked(server.url, tmp_path, seed, "mixed")
    assert code == 0 and {e["name"]: e["status"] for e in report["experiments"]} == {"needle": "clean",
                                                                                     "sampled": "clean"}


def test_negative_control_a_mask_shared_by_the_batch_is_reported_variant(server, tmp_path, seed, monkeypatch):
    share_masks_across_the_batch(monkeypatch)
    code, report = checked(server.url, tmp_path, seed, "json")
    assert code == 1 and report["verdict"] == "variant", [(e["name"], e["status"]) for e in report["experiments"]]
