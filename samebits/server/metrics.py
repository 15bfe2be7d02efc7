"""Prometheus metrics of one server, in its own registry (two servers in one process never share series).

Engine state (running/waiting, KV usage, prefix cache, preemptions) is read at scrape time from the snapshot the
engine thread takes after each step; token counters come from the AsyncEngine; latencies are observed per request.
"""
from __future__ import annotations

from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)


class _EngineCollector:
    def __init__(self, async_engine) -> None:
        self.ae = async_engine

    def collect(self) -> Iterable:
        yield from self._gauges()
        yield from self._counters()

    def _gauges(self) -> Iterable:
        s, ae = self.ae.stats, self.ae
        yield _gauge("num_requests_running", "Requests being generated.", s.num_running)
        yield _gauge("num_requests_waiting", "Requests waiting for their first token.", s.num_waiting)
        yield _gauge("kv_cache_usage_ratio", "Fraction of KV blocks in use (0..1).", s.kv_usage)
        yield _gauge("engine_healthy", "1 while the engine loop runs.", float(ae.healthy))

    def _counters(self) -> Iterable:
        s, c = self.ae.stats, self.ae.counters
        yield _counter("prompt_tokens", "Prompt tokens of admitted requests.", c.prompt_tokens)
        yield _counter("generation_tokens", "Generated tokens.", c.generation_tokens)
        yield _counter("requests_finished", "Requests that finished.", c.requests_finished)
        yield _counter("requests_aborted", "Requests aborted before they finished.", c.requests_aborted)
        yield _counter("requests_rejected_queue_full", "Requests refused with a full queue.", c.requests_rejected)
        yield _counter("prefix_cache_queries", "Prompt tokens looked up in the prefix cache.",
                       s.prefix_queries)
        yield _counter("prefix_cache_hits", "Prompt tokens found in the prefix cache.",
                       s.prefix_hits)
        yield _counter("num_preemptions", "Sequences preempted (recomputed) for lack of KV blocks.",
                       s.num_preemptions)


def _gauge(name: str, doc: str, value: float) -> GaugeMetricFamily:
    return GaugeMetricFamily(f"samebits_{name}", doc, value=value)


def _counter(name: str, doc: str, value: float) -> CounterMetricFamily:
    return CounterMetricFamily(f"samebits_{name}", doc, value=value)


class Metrics:
    def __init__(self, async_engine) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self.registry.register(_EngineCollector(async_engine))
        self.ttft = Histogram("samebits_time_to_first_token_seconds", "Time from admission to the first token.",
                              buckets=LATENCY_BUCKETS, registry=self.registry)
        self.e2e = Histogram("samebits_e2e_request_latency_seconds", "Time from admission to the last token.",
                             buckets=LATENCY_BUCKETS, registry=self.registry)
        self.disconnects = Counter("samebits_client_disconnects", "Clients that left before their response ended.",
                                   registry=self.registry)
        self.http_errors = Counter("samebits_http_errors", "Error responses by status.", ["status"],
                                   registry=self.registry)

        # Observed per engine request by the AsyncEngine, which sees each output first.
        async_engine.on_first_output = self.ttft.observe
        async_engine.on_finished = self.e2e.observe

    def render(self) -> bytes:
        return generate_latest(self.registry)
