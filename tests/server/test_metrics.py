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
    "inter_token_latency_seconds": "histogram", "time_per_output_token_seconds": "histogram",
    "request_decode_time_seconds": "histogram", "request_prompt_tokens": "histogram",
    "request_generation_tokens": "histogram", "request_max_num_generation_tokens": "histogram",
    "request_success": "counter",
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


def _sample_values(found: dict, name: str) -> dict:
    return {(s.name, tuple(sorted((k, v) for k, v in s.labels.items() if k != "model_name"))): s.value
            for s in found[f"samebits:{name}"].samples}


def test_per_request_series_count_what_the_requests_did(server):
    """Two samples of 4 tokens ending by length, one of 3 ending by a stop id: the counts are exact."""
    before = families(server)
    with server.client() as http:
        body = {"model": MODEL_NAME, "prompt": "hello there", "max_tokens": 4, "n": 2, "temperature": 1.0, "seed": 1,
                "ignore_eos": True}
        assert http.post("/v1/completions", json=body).status_code == 200
        first = http.post("/v1/completions", json={**body, "n": 1, "max_tokens": 8}).json()["choices"][0]
        stop = first["token_ids"][2]
        r = http.post("/v1/completions", json={**body, "n": 1, "max_tokens": 8, "stop_token_ids": [stop]})
        assert r.json()["choices"][0]["finish_reason"] == "stop"
        stopped_at = r.json()["choices"][0]["token_ids"].index(stop) + 1
        text = http.get("/metrics").text
    after = {f.name: f for f in text_string_to_metric_families(text)}

    def delta(name, key):
        return _sample_values(after, name).get(key, 0) - _sample_values(before, name).get(key, 0)

    total = ("samebits:request_success_total", (("finished_reason", "length"),))
    assert delta("request_success", total) == 3  # 2 samples + the 8-token probe
    assert delta("request_success", ("samebits:request_success_total", (("finished_reason", "stop"),))) == 1
    count = ("samebits:request_generation_tokens_count", ())
    assert delta("request_generation_tokens", count) == 4
    assert delta("request_generation_tokens", ("samebits:request_generation_tokens_sum", ())) == 8 + 8 + stopped_at
    # One inter-token latency per token after each sample's first.
    itl = delta("inter_token_latency_seconds", ("samebits:inter_token_latency_seconds_count", ()))
    assert itl == (8 - 2) + (8 - 1) + (stopped_at - 1)
    assert itl == delta("time_per_output_token_seconds", ("samebits:time_per_output_token_seconds_count", ()))
    assert delta("request_max_num_generation_tokens", ("samebits:request_max_num_generation_tokens_sum", ())) == \
        4 + 8 + stopped_at
    assert delta("request_prompt_tokens", ("samebits:request_prompt_tokens_count", ())) == 3
    for name in ("request_queue_time_seconds", "request_prefill_time_seconds"):  # one per request, at its first output
        assert delta(name, (f"samebits:{name}_count", ())) == 3
        assert delta(name, (f"samebits:{name}_sum", ())) > 0


def test_the_grafana_dashboard_queries_only_exported_series(server):
    import json
    import re
    from pathlib import Path

    dashboard = json.loads((Path(__file__).parents[2] / "docs" / "grafana.json").read_text())
    exprs = [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    queried = {re.sub(r"_(bucket|sum|count|total)$", "", n) for e in exprs for n in re.findall(r"samebits:\w+", e)}
    exported = set(families(server))
    assert len(queried) >= 15 and queried <= exported, sorted(queried - exported)
    assert all('model_name="$model_name"' in e for e in exprs)


def test_counted_observations_export_as_prometheus_histograms_do():
    """The inter-token histogram takes one call per step's equal gaps; its exposition is prometheus_client's for the
    same observations one by one (dyadic values, so the sums are exact in either order)."""
    from prometheus_client import CollectorRegistry, Histogram, generate_latest

    from samebits.server.metrics import ITL_BUCKETS, _CountingHistogram

    theirs, ours = CollectorRegistry(auto_describe=False), CollectorRegistry(auto_describe=False)
    one_by_one = Histogram("samebits:x_seconds", "doc", ["model_name"], buckets=ITL_BUCKETS, registry=theirs)
    counted = _CountingHistogram("samebits:x_seconds", "doc", MODEL_NAME, ITL_BUCKETS)
    ours.register(counted)
    observations = [(2.0**-10, 3), (2.0**-8, 1), (0.03125, 256), (0.5, 2), (1024.0, 1), (0.0, 4)]
    for value, count in observations:
        for _ in range(count):
            one_by_one.labels(MODEL_NAME).observe(value)
        counted.observe(value, count)
    counted.created = one_by_one.labels(MODEL_NAME)._created
    assert generate_latest(ours) == generate_latest(theirs)
    counted.observe(0.005, 1)  # negative control: one observation more shows
    assert generate_latest(ours) != generate_latest(theirs)


def test_spec_decode_counters_under_vllms_names_only_with_speculation():
    """vLLM's spec_decode_* counters (vllm/v1/spec_decode/metrics.py), from the engine's stats; none without
    speculation, as vLLM registers them only when it is on."""
    from types import SimpleNamespace

    from prometheus_client import CollectorRegistry, generate_latest

    from samebits.engine.outputs import EngineStats
    from samebits.server.metrics import _EngineCollector

    def scrape(stats):
        registry = CollectorRegistry(auto_describe=False)
        registry.register(_EngineCollector(SimpleNamespace(stats=stats, healthy=True, health=dict, counters=SimpleNamespace(
            prompt_tokens=0, generation_tokens=0, requests_finished=0, requests_aborted=0, requests_rejected=0)),
            MODEL_NAME))
        return {f.name: f for f in text_string_to_metric_families(generate_latest(registry).decode())}

    off = EngineStats(1, 0, 0.1, 0, 0, 0, 5, 9)
    assert not [n for n in scrape(off) if "spec_decode" in n]
    found = scrape(EngineStats(1, 0, 0.1, 0, 0, 0, 5, 9, spec_num_drafts=4, spec_num_draft_tokens=13,
                               spec_num_accepted_tokens=7, spec_accepted_per_pos=(3, 2, 1, 1)))
    values = {(s.name, s.labels.get("position")): s.value for f in found.values() for s in f.samples
              if s.name.startswith("samebits:spec_decode") and not s.name.endswith("_created")}
    assert values == {
        ("samebits:spec_decode_num_drafts_total", None): 4, ("samebits:spec_decode_num_draft_tokens_total", None): 13,
        ("samebits:spec_decode_num_accepted_tokens_total", None): 7,
        **{("samebits:spec_decode_num_accepted_tokens_per_pos_total", str(p)): v for p, v in enumerate((3, 2, 1, 1))}}
    assert all(found[n].type == "counter" for n in found if "spec_decode" in n)
