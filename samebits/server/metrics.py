"""Prometheus metrics of one server, in its own registry (two servers in one process never share series).

Names are vLLM's (`vllm:num_requests_running` is `samebits:num_requests_running` here) and every series carries the
`model_name` label, so dashboards built for vLLM read them unchanged. Engine state (running/waiting, KV usage, prefix
cache, preemptions) is read at scrape time from the snapshot the engine thread takes after each step; token counters
come from the AsyncEngine; latencies are observed per request.
"""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "samebits:"
MODEL_LABEL = "model_name"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class _EngineCollector:
    def __init__(self, async_engine, model_name: str) -> None:
        self.ae, self.model_name = async_engine, model_name

    def collect(self) -> Iterable:
        yield from self._gauges()
        yield from self._counters()

    def _gauges(self) -> Iterable:
        s, ae = self.ae.stats, self.ae
        yield self._family(GaugeMetricFamily, "num_requests_running", "Requests being generated.", s.num_running)
        yield self._family(GaugeMetricFamily, "num_requests_waiting", "Requests waiting for their first token.",
                           s.num_waiting)
        # vLLM's name; like vLLM's, the value is a fraction (1 = every KV block in use), not a percentage.
        yield self._family(GaugeMetricFamily, "kv_cache_usage_perc", "Fraction of KV blocks in use (0..1).",
                           s.kv_usage)
        yield self._family(GaugeMetricFamily, "engine_healthy", "1 while the engine loop runs.", float(ae.healthy))

    def _counters(self) -> Iterable:
        s, c = self.ae.stats, self.ae.counters
        counters = (
            ("prompt_tokens", "Prompt tokens of admitted requests.", c.prompt_tokens),
            ("generation_tokens", "Generated tokens.", c.generation_tokens),
            ("requests_finished", "Requests that finished.", c.requests_finished),
            ("requests_aborted", "Requests aborted before they finished.", c.requests_aborted),
            ("requests_rejected_queue_full", "Requests refused with a full queue.", c.requests_rejected),
            ("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.", s.prefix_queries),
            ("prefix_cache_hits", "Prompt tokens found in the prefix cache.", s.prefix_hits),
            ("num_preemptions", "Sequences preempted (recomputed) for lack of KV blocks.", s.num_preemptions),
        )
        for name, doc, value in counters:
            yield self._family(CounterMetricFamily, name, doc, value)

    def _family(self, kind, name: str, doc: str, value: float):
        family = kind(PREFIX + name, doc, labels=[MODEL_LABEL])
        family.add_metric([self.model_name], value)
        return family


class Metrics:
    def __init__(self, async_engine, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(async_engine, model_name))
        ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time from admission to the first token.",
                         [MODEL_LABEL], buckets=LATENCY_BUCKETS, registry=self.registry)
        e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Time from admission to the last token.",
                        [MODEL_LABEL], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.ttft, self.e2e = ttft.labels(model_name), e2e.labels(model_name)
        self.disconnects = Counter(PREFIX + "client_disconnects", "Clients that left before their response ended.",
                                   [MODEL_LABEL], registry=self.registry).labels(model_name)
        self._http_errors = Counter(PREFIX + "http_errors", "Error responses by status.", [MODEL_LABEL, "status"],
                                    registry=self.registry)
        self.model_name = model_name

        # Observed per engine request by the AsyncEngine, which sees each output first.
        async_engine.on_first_output = self.ttft.observe
        async_engine.on_finished = self.e2e.observe

    def http_error(self, status: int) -> None:
        self._http_errors.labels(self.model_name, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
