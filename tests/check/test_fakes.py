"""samebits check against fake endpoints whose one flaw is known: each flaw must be caught by the experiment built
for it and by no other, and a flawless endpoint must come out clean on both APIs."""
from __future__ import annotations

import json

import pytest

from samebits.check import run
from tests.check.fake_openai import MODEL, FakeServer, Flaws, State

SMALL = {"concurrency": (1, 4, 8), "trials": 2, "max_tokens": 6, "needle_words": 8, "filler_words": (2, 10),
         "prefix_words": 16, "quiet": True}


def check(url: str, tmp_path, **options) -> tuple[int, dict]:
    path = tmp_path / "report.json"
    code = run(url, json_path=path, **{**SMALL, **options})
    return code, json.loads(path.read_text())


def statuses(report: dict) -> dict[str, str]:
    return {e["name"]: e["status"] for e in report["experiments"]}


def test_inflight_dependent_outputs_are_caught_by_needle(tmp_path, seed):
    # step_s makes each request last long enough that a burst is in flight together, as a real batch would be.
    with FakeServer(Flaws(inflight_shift=1e-6, step_s=0.05)) as url:
        code, report = check(url, tmp_path, experiments=("needle",), seed=seed)
    assert code == 1 and report["verdict"] == "variant"
    groups = {g["level"]: g for g in report["experiments"][0]["groups"]}
    assert groups[1]["diverged"] == 0  # alone is alone: the reference itself is stable
    assert groups[4]["diverged"] == groups[4]["observations"] == 2
    assert groups[8]["diverged"] == 2 and groups[8]["first_divergence"] == 0
    assert 0 < groups[4]["max_abs_delta"] < groups[8]["max_abs_delta"] < 1e-5


def test_prefill_decode_mismatch_is_caught_by_prefill_only(tmp_path, seed):
    with FakeServer(Flaws(echo_shift=2**-20)) as url:
        code, report = check(url, tmp_path, seed=seed)
    assert code == 1
    assert statuses(report) == {"needle": "clean", "sampled": "clean", "prefix": "clean", "prefill": "variant",
                                "repeat": "clean"}
    prefill = report["experiments"][3]
    assert prefill["method"] == "echo+logprobs"
    assert all(g["diverged"] == 1 and g["unique_outputs"] == 2 for g in prefill["groups"])


def test_explicit_tolerance_absorbs_the_shift_and_says_so(tmp_path, seed):
    with FakeServer(Flaws(echo_shift=2**-20)) as url:
        code, report = check(url, tmp_path, experiments=("prefill",), tolerance=1e-5, seed=seed)
    assert code == 0 and statuses(report) == {"prefill": "clean"}
    assert report["comparison"] == {"tolerance": 1e-5, "exact": False,
                                    "what": "token ids (or token strings) and logprob values as sent"}
    assert report["experiments"][0]["groups"][0]["max_abs_delta"] > 0


def test_deterministic_endpoint_is_clean_on_chat_and_prefill_says_why_it_skipped(tmp_path, seed):
    with FakeServer() as url:
        code, report = check(url, tmp_path, api="chat", seed=seed)
    assert code == 0 and report["verdict"] == "clean"
    assert statuses(report)["prefill"] == "skipped"
    assert "completions API" in report["experiments"][3]["note"]
    assert report["endpoint"]["system_fingerprints"] == {"fp_fake": report["requests"] - 1}  # all but GET /models
    assert report["endpoint"]["headers"]["x-fake-fingerprint"] == {"fake-numerics-1": report["requests"] - 1}


def test_endpoint_without_echo_skips_prefill_and_names_both_methods(tmp_path, seed):
    with FakeServer(Flaws(echo=False)) as url:
        code, report = check(url, tmp_path, experiments=("prefill",), seed=seed)
    assert code == 2 and report["verdict"] == "could not test"  # nothing was tested at all
    note = report["experiments"][0]["note"]
    assert "echo+logprobs: HTTP 400 echo is not supported" in note and "prompt_logprobs: ignored" in note


def test_compare_replays_references_and_catches_a_changed_answer(tmp_path, seed):
    with FakeServer() as url:
        code, first = check(url, tmp_path, experiments=("needle", "repeat"), seed=seed)
        assert code == 0
        old = tmp_path / "old.json"
        first["references"][0]["sample"]["logprobs"][2] += 2**-30  # as if the server had changed since
        old.write_text(json.dumps(first))
        code, again = check(url, tmp_path, experiments=("repeat",), compare=old, seed=seed)
    assert code == 1 and again["compared_to"] == str(old)
    vs = [g for g in again["experiments"][0]["groups"] if g["label"].startswith("vs ")]
    assert [g["diverged"] for g in vs] == [1, 0]  # needle's stored answer was edited, repeat's was not
    assert vs[0]["first_divergence"] == 2


def test_429_is_retried_with_backoff_and_every_attempt_counts(tmp_path, seed):
    with FakeServer(Flaws(busy_first=3)) as fake_url:
        code, report = check(fake_url, tmp_path, experiments=("repeat",), seed=seed)
    assert code == 0
    assert report["requests"] == 1 + 3 + 1 + 3  # GET /models, 3 refused + the probe, 3 repeat sends


def test_html_is_self_contained_with_an_inline_plot(tmp_path, seed):
    html = tmp_path / "r.html"
    with FakeServer(Flaws(inflight_shift=1e-6, step_s=0.05)) as url:
        code = run(url, html_path=html, **{**SMALL, "experiments": ("needle",), "seed": seed})
    page = html.read_text()
    assert code == 1
    assert "<svg" in page and "<img" not in page and "http" not in page.split("<svg")[0].split("<p>")[0]
    assert "report JSON" in page and MODEL in page


@pytest.mark.parametrize("tolerance", [-1.0, float("nan")])
def test_bad_tolerance_is_one_line_and_exit_2(tolerance, capsys):
    assert run("http://127.0.0.1:9", tolerance=tolerance, quiet=True) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("samebits check: error: tolerance must be") and "\n" not in err


def test_the_fake_tracks_in_flight_requests_by_identity():
    # Equal-valued entries once let one request's leave remove another's; the later leave then raised mid-response.
    state = State(Flaws())
    a, b = state.enter(), state.enter()
    state.leave(b)
    c, d = state.enter(), state.enter()
    assert [r["peak"] for r in state.active] == [3, 3, 3] and state.active[0] is a
    for r in (a, c, d):
        state.leave(r)
    assert state.active == []
