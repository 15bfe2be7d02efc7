"""Prometheus metrics of one server, in its own registry (two servers in one process never share series).

Names are vLLM's (`vllm:num_requests_running` is `samebits:num_requests_running` here) and every series carries the
`model_name` label, so dashboards built for vLLM read them unchanged. Engine state (running/waiting, KV usage, prefix
cache, preemptions) is read at scrape time from the snapshot the engine thread takes after each step; token counters
come from the AsyncEngine; latencies and per-request sizes are observed as the outputs reach the event loop, per
sample where vLLM counts per (child) request: finish reasons, generated tokens, inter-token latency.

Queue time runs from a request's arrival at the AsyncEngine to its first scheduling (`RequestOutput.
first_scheduled_time`, the scheduler's admission), prefill time from there to its first output, as vLLM defines them.
"""
from __future__ import annotations

import bisect
import math
import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.utils import floatToGoString

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PREFIX = "samebits:"
MODEL_LABEL = "model_name"
LATENCY_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 20.0, 40.0, 80.0, 160.0, 320.0)
# vLLM's inter-token buckets: decode steps are milliseconds apart.
ITL_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5,
               10.0, 20.0, 40.0, 80.0)
# Token counts per request: 1-2-5 steps, as vLLM's, up to a long context.
TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000, 100000)


class _EngineCollector:
    def __init__(self, async_engine, model_name: str) -> None:
        self.ae, self.model_name = async_engine, model_name
        self.supervisor = None  # server/supervisor.py's, once the server has one

    def collect(self) -> Iterable:
        yield from self._gauges()
        yield from self._counters()
        yield from self._spec_decode()
        yield from self._replicas(self.ae.health().get("replicas", ()))
        if self.supervisor is not None:
            yield self._family(CounterMetricFamily, "engine_restarts", "Restarts of a dead engine process.",
                               self.supervisor.restarts)

    def _replicas(self, replicas) -> Iterable:
        """A fleet's replicas (fleet/engine.py), one series each under the `replica` label."""
        if not replicas:
            return
        series = (
            (GaugeMetricFamily, "replica_up", "1 while the replica serves.", lambda r: float(r["state"] == "up")),
            (GaugeMetricFamily, "replica_outstanding_tokens", "Tokens routed to the replica, not yet done.", lambda r: r["outstanding_tokens"]),
            (GaugeMetricFamily, "replica_requests_running", "Requests on the replica.", lambda r: r["requests"]),
            (CounterMetricFamily, "replica_requests_routed", "Requests routed to the replica.", lambda r: r["routed"]),
            (CounterMetricFamily, "replica_restarts", "Times the replica was lost and restarted.",
             lambda r: r["restarts"]),
        )
        for kind, name, doc, value in series:
            family = kind(PREFIX + name, doc, labels=[MODEL_LABEL, "replica"])
            for r in replicas:
                family.add_metric([self.model_name, str(r["replica"])], value(r))
            yield family

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

    def _spec_decode(self) -> Iterable:
        """vLLM's speculative-decoding counters, exported when speculation is on (as vLLM registers them); the
        acceptance rate and mean acceptance length are PromQL over them (docs/METRICS.md)."""
        s = self.ae.stats
        if not s.spec_accepted_per_pos:
            return
        counters = (
            ("spec_decode_num_drafts", "Verified drafts (one per decode chunk that verified any).", s.spec_num_drafts),
            ("spec_decode_num_draft_tokens", "Draft tokens verified.", s.spec_num_draft_tokens),
            ("spec_decode_num_accepted_tokens", "Draft tokens accepted.", s.spec_num_accepted_tokens),
        )
        for name, doc, value in counters:
            yield self._family(CounterMetricFamily, name, doc, value)
        family = CounterMetricFamily(PREFIX + "spec_decode_num_accepted_tokens_per_pos",
                                     "Accepted tokens per draft position.", labels=[MODEL_LABEL, "position"])
        for position, value in enumerate(s.spec_accepted_per_pos):
            family.add_metric([self.model_name, str(position)], value)
        yield family

    def _family(self, kind, name: str, doc: str, value: float):
        family = kind(PREFIX + name, doc, labels=[MODEL_LABEL])
        family.add_metric([self.model_name], value)
        return family


class _Alias:
    """A collector's series under another name, from the same observations: vLLM's older name costs no second
    observation per token (an observation is most of the metrics' share of the event loop's time)."""

    def __init__(self, source, name: str, documentation: str) -> None:
        self.source, self.name, self.documentation = source, name, documentation

    def collect(self) -> Iterable:
        for family in self.source.collect():
            alias = Metric(self.name, self.documentation, family.type)
            alias.samples = [s._replace(name=self.name + s.name[len(family.name):]) for s in family.samples]
            yield alias


class _CountingHistogram:
    """One series of a labelled histogram, exported as prometheus_client's Histogram exports it, whose observation
    takes a count: a step's equal inter-token gaps are one call, not one per token."""

    def __init__(self, name: str, documentation: str, model_name: str, buckets) -> None:
        self.name, self.documentation, self.model_name = name, documentation, model_name
        self.bounds = [float(b) for b in buckets] + [math.inf]
        self.counts = [0.0] * len(self.bounds)
        self.sum = 0.0
        self.created = time.time()

    def observe(self, value: float, count: int = 1) -> None:
        self.counts[bisect.bisect_left(self.bounds, value)] += count  # the first bucket with value <= its bound
        self.sum += value * count

    def collect(self) -> Iterable:
        family = Metric(self.name, self.documentation, "histogram")
        labels, total = {MODEL_LABEL: self.model_name}, 0.0
        for bound, count in zip(self.bounds, self.counts):
            total += count
            family.add_sample(self.name + "_bucket", {"le": floatToGoString(bound), **labels}, total)
        family.add_sample(self.name + "_count", labels, total)
        family.add_sample(self.name + "_sum", labels, self.sum)
        family.add_sample(self.name + "_created", labels, self.created)
        yield family


class _RequestMetrics:
    """The per-output series, observed once per engine step: queue and prefill times at a request's first output,
    inter-token latency per token, and at the end each sample's finish reason and size."""

    def __init__(self, registry, model_name: str) -> None:
        def hist(name: str, doc: str, buckets):
            return Histogram(PREFIX + name, doc, [MODEL_LABEL], buckets=buckets, registry=registry).labels(model_name)

        # Both of vLLM's names for one series: its dashboard reads the older, its newer releases export the newer.
        self.itl = _CountingHistogram(PREFIX + "inter_token_latency_seconds", "Time between consecutive output "
                                      "tokens.", model_name, ITL_BUCKETS)
        registry.register(self.itl)
        registry.register(_Alias(self.itl, PREFIX + "time_per_output_token_seconds", "Time between consecutive "
                                 "output tokens (vLLM's older name for inter_token_latency_seconds)."))
        self.decode = hist("request_decode_time_seconds", "Time from a request's first token to its last.",
                           LATENCY_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Time from a request's arrival to its first scheduling.",
                          LATENCY_BUCKETS)
        self.prefill = hist("request_prefill_time_seconds", "Time from a request's first scheduling to its first "
                            "token.", LATENCY_BUCKETS)
        self.prompt = hist("request_prompt_tokens", "Prompt tokens per request.", TOKEN_BUCKETS)
        self.generation = hist("request_generation_tokens", "Generated tokens per sample.", TOKEN_BUCKETS)
        self.max_generation = hist("request_max_num_generation_tokens", "Most tokens any sample of a request "
                                   "generated.", TOKEN_BUCKETS)
        self._success = Counter(PREFIX + "request_success", "Samples finished, by finish reason.",
                                [MODEL_LABEL, "finished_reason"], registry=registry)
        self.model_name = model_name

    def observe_step(self, now: float, entries: list) -> None:
        """AsyncEngine.on_step: how far one engine step took each request (its StepProgress), its output if one was
        due, its stream and the gap since its last progress."""
        gaps: dict[float, int] = {}
        for step, out, stream, gap in entries:
            if gap is None:
                self._first(step.first_scheduled_time, stream, now)
            elif step.new_tokens:  # one observation per output token; the requests of one step mostly share a gap
                gaps[gap] = gaps.get(gap, 0) + step.new_tokens
            if out is not None and out.finished:
                self._finish(out, now - stream.first_output)
        for gap, count in gaps.items():
            self.itl.observe(gap, count)

    def _first(self, first_scheduled_time: float | None, stream, now: float) -> None:
        if first_scheduled_time is not None:  # both on time.monotonic()
            self.queue.observe(max(0.0, first_scheduled_time - stream.arrival))
            self.prefill.observe(max(0.0, now - first_scheduled_time))

    def _finish(self, out, decode_s: float) -> None:
        self.decode.observe(decode_s)
        self.prompt.observe(len(out.prompt_token_ids))
        self.max_generation.observe(max((len(c.token_ids) for c in out.outputs), default=0))
        for c in out.outputs:
            self.generation.observe(len(c.token_ids))
            self._success.labels(self.model_name, c.finish_reason or "abort").inc()


class Metrics:
    def __init__(self, async_engine, model_name: str) -> None:
        self.registry = CollectorRegistry(auto_describe=False)
        self._engine = _EngineCollector(async_engine, model_name)
        self.registry.register(self._engine)
        ttft = Histogram(PREFIX + "time_to_first_token_seconds", "Time from admission to the first token.",
                         [MODEL_LABEL], buckets=LATENCY_BUCKETS, registry=self.registry)
        e2e = Histogram(PREFIX + "e2e_request_latency_seconds", "Time from admission to the last token.",
                        [MODEL_LABEL], buckets=LATENCY_BUCKETS, registry=self.registry)
        self.ttft, self.e2e = ttft.labels(model_name), e2e.labels(model_name)
        self.disconnects = Counter(PREFIX + "client_disconnects", "Clients that left before their response ended.",
                                   [MODEL_LABEL], registry=self.registry).labels(model_name)
        self._http_errors = Counter(PREFIX + "http_errors", "Error responses by status.", [MODEL_LABEL, "status"],
                                    registry=self.registry)
        self.write_timeouts = Counter(PREFIX + "write_timeouts", "Connections cut because the client read nothing for "
                                      "--timeout-write seconds (their requests aborted).", [MODEL_LABEL],
                                      registry=self.registry).labels(model_name)
        self.model_name = model_name
        # Observed by the AsyncEngine, which sees each output first: per request, and per step.
        async_engine.on_first_output = self.ttft.observe
        async_engine.on_finished = self.e2e.observe
        async_engine.on_step = _RequestMetrics(self.registry, model_name).observe_step

    def watch(self, supervisor) -> None:
        """Export the engine supervisor's restarts (server/supervisor.py)."""
        self._engine.supervisor = supervisor

    def http_error(self, status: int) -> None:
        self._http_errors.labels(self.model_name, str(status)).inc()

    def render(self) -> bytes:
        return generate_latest(self.registry)
