"""A server whose engine speculates answers with the plain server's bodies and streams, and exports vLLM's
spec-decode counters (docs/SPECULATIVE.md)."""
from __future__ import annotations

import json

import pytest

from tests.server.conftest import MODEL_NAME, start_server


@pytest.fixture(scope="module")
def speculating(tiny_model_dir):
    from samebits.engine.config import EngineConfig
    from samebits.engine.llm_engine import LLMEngine

    spec = {"method": "ngram", "num_speculative_tokens": 4, "prompt_lookup_min": 1, "prompt_lookup_max": 2}
    live = start_server(LLMEngine(EngineConfig(model=str(tiny_model_dir), device="cpu", max_num_seqs=128,
                                               max_model_len=256, speculative_config=spec)), max_n=16)
    yield live
    live.stop()


def choices(server, body: dict) -> list:
    with server.client() as http:
        r = http.post("/v1/completions", json=body)
    assert r.status_code == 200, r.text
    return [(c["text"], c["token_ids"], c["logprobs"]["token_logprobs"], c["finish_reason"]) for c in r.json()["choices"]]


def streamed(server, body: dict) -> list:
    with server.client() as http:
        text = http.post("/v1/completions", json={**body, "stream": True}).text
    events = [json.loads(e.removeprefix("data: ")) for e in text.split("\n\n") if e and e != "data: [DONE]"]
    out: dict[int, list] = {}
    for c in (c for e in events for c in e["choices"]):
        acc = out.setdefault(c["index"], ["", [], [], None])
        acc[0] += c["text"]
        acc[1] += c["token_ids"]
        acc[2] += c["logprobs"]["token_logprobs"] if c["logprobs"] else []
        acc[3] = c["finish_reason"] or acc[3]
    return [tuple(out[i]) for i in sorted(out)]


def test_bodies_streams_and_counters(server, speculating):
    body = {"model": MODEL_NAME, "prompt": ["hello hello hello", "the cat sat on the cat"], "max_tokens": 24,
            "temperature": 0, "logprobs": 1, "ignore_eos": True}
    sampled = {**body, "temperature": 0.05, "seed": 4, "n": 2}
    for b in (body, sampled):
        expected = choices(server, b)
        assert choices(speculating, b) == expected
        assert streamed(speculating, b) == expected
    with speculating.client() as http:
        metrics = http.get("/metrics").text
    drafts = [ln for ln in metrics.splitlines() if ln.startswith("samebits:spec_decode_num_accepted_tokens_total")]
    assert len(drafts) == 1 and float(drafts[0].split()[-1]) > 0
