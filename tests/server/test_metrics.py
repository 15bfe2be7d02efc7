"""/metrics under vLLM's names (prefix `samebits:`), every series labelled with the served model's name, parsed with
prometheus_client's own text parser as a Prometheus server would read it."""
from __future__ import annotations

from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL_NAME

# vLLM's metric -> its Prometheus type, as `vllm:<name>` in vLLM's exposition.
VLLM_NAMES = {
    "num_requests_running": "gauge", "num_requests_waiting": "gauge", "kv_cache_usage_perc": "gauge",
    "prompt_tokens": "counter", "generation_tokens": "counter", "prefix_cache_queries": "counter",
    "prefix_cache_hits": "counter", "num_preemptions": "counter",
    "time_to_first_token_seconds": "histogram", "e2e_request_latency_seconds": "histogram",
}


def families(server) -> dict:
    with server.client() as http:
        http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "hello", "max_tokens": 2})
        text = http.get("/metrics").text
    return {f.name: f for f in text_string_to_metric_families(text)}


def test_vllm_metric_names_types_and_model_label(server):
    found = families(server)
    for name, kind in VLLM_NAMES.items():
        family = found.get(f"samebits:{name}")
        assert family is not None, f"samebits:{name} missing; have {sorted(found)}"
        assert family.type == kind, (name, family.type)
        assert family.samples and all(s.labels.get("model_name") == MODEL_NAME for s in family.samples), name
    counts = {s.name: s.value for s in found["samebits:prompt_tokens"].samples}
    assert counts["samebits:prompt_tokens_total"] > 0
    ttft = {s.name: s.value for s in found["samebits:time_to_first_token_seconds"].samples if "le" not in s.labels}
    assert ttft["samebits:time_to_first_token_seconds_count"] >= 1


def test_every_series_is_ours_and_labelled(server):
    found = families(server)
    ours = {n: f for n, f in found.items() if n.startswith("samebits")}
    assert ours and all(n.startswith("samebits:") for n in ours), sorted(ours)
    assert all(s.labels.get("model_name") == MODEL_NAME for f in ours.values() for s in f.samples)
    usage = [s.value for s in found["samebits:kv_cache_usage_perc"].samples]
    assert len(usage) == 1 and 0.0 <= usage[0] <= 1.0
