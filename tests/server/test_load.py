"""Load on the real engine: concurrent streams equal their solo runs; abandoned requests free their KV blocks;
metrics counters move by the known token counts."""
from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time

import httpx
from prometheus_client.parser import text_string_to_metric_families

from tests.server.conftest import MODEL_NAME

N_STREAMS = 64
ABANDON_AFTER_S = 8.0  # a cap; the clients normally leave as soon as 64 of theirs run


def body(i: int, stream: bool, max_tokens: int = 5) -> dict:
    # Prompts of different lengths, so the concurrent batch mixes prefill and decode rows of many shapes.
    return {"model": MODEL_NAME, "prompt": "the cat sat on the mat " * (1 + i % 5) + str(i), "max_tokens": max_tokens,
            "temperature": 0.7, "seed": 1000 + i, "logprobs": 1, "stream": stream, "ignore_eos": i % 2 == 0}


def chat_body(i: int, stream: bool) -> dict:
    return {"model": MODEL_NAME, "messages": [{"role": "user", "content": "the cat " * (1 + i % 3) + str(i)}],
            "max_tokens": 5, "temperature": 0.7, "seed": 1000 + i, "logprobs": True, "stream": stream}


def is_chat(i: int) -> bool:
    return i % 4 == 3  # a quarter of the mix goes through the chat template and the chat renderer


def request_of(i: int, stream: bool) -> tuple[str, dict]:
    if is_chat(i):
        return "/v1/chat/completions", chat_body(i, stream)
    return "/v1/completions", body(i, stream)


def choice_lps(c: dict) -> list[float]:
    if not c["logprobs"]:
        return []
    if "content" in c["logprobs"]:
        return [t["logprob"] for t in c["logprobs"]["content"]]
    return c["logprobs"]["token_logprobs"]


def parse_stream(text: str) -> tuple[list[int], list[float]]:
    events = [e for e in text.split("\n\n") if e]
    assert events[-1] == "data: [DONE]", events[-1]
    ids, lps = [], []
    for e in events[:-1]:
        obj = json.loads(e.removeprefix("data: "))
        assert "error" not in obj, obj
        for c in obj["choices"]:
            ids += c.get("token_ids", [])
            lps += choice_lps(c)
    return ids, lps


def solo(http: httpx.Client, i: int) -> tuple[list[int], list[float]]:
    path, req = request_of(i, stream=False)
    c = http.post(path, json=req).json()["choices"][0]
    return c["token_ids"], choice_lps(c)


class PeakRunning:
    """Samples the engine's running count from a thread while the block runs (evidence the streams overlapped)."""

    def __init__(self, async_engine):
        self.ae, self.peak, self._stop = async_engine, 0, threading.Event()

    def __enter__(self):
        self.thread = threading.Thread(target=self._poll, daemon=True)
        self.thread.start()
        return self

    def _poll(self):
        while not self._stop.wait(0.005):
            stats = self.ae.stats
            self.peak = max(self.peak, getattr(stats, "num_running", 0) if stats is not None else 0)

    def __exit__(self, *exc):
        self._stop.set()
        self.thread.join(5)


def wait_idle(server, timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while server.engine.has_unfinished_requests() or server.async_engine.num_waiting or server.async_engine.num_running:
        assert time.monotonic() < deadline, "engine did not drain"
        time.sleep(0.02)


def test_concurrent_streams_equal_solo_runs(server):
    check_streams_equal_solo_runs(server)


def check_streams_equal_solo_runs(server) -> None:
    with server.client() as http:
        alone = [solo(http, i) for i in range(N_STREAMS)]
    assert all(ids and len(ids) == len(lps) for ids, lps in alone)

    async def run_all():
        limits = httpx.Limits(max_connections=N_STREAMS + 8)
        async with httpx.AsyncClient(base_url=server.url, timeout=120, limits=limits) as http:
            async def one(i):
                path, req = request_of(i, stream=True)
                r = await http.post(path, json=req)
                assert r.status_code == 200, r.text
                return parse_stream(r.text)

            return await asyncio.gather(*(one(i) for i in range(N_STREAMS)))

    with PeakRunning(server.async_engine) as peak:
        together = asyncio.run(run_all())
    assert peak.peak >= 8, f"streams barely overlapped (peak running {peak.peak})"
    for i, (a, b) in enumerate(zip(alone, together)):
        assert a == b, f"stream {i} differs from its solo run"


def metric_values(http: httpx.Client) -> dict[str, float]:
    out = {}
    for fam in text_string_to_metric_families(http.get("/metrics").text):
        for s in fam.samples:
            if set(s.labels) <= {"model_name"}:  # one model per server: its series by name alone
                out[s.name] = s.value
    return out


def test_metrics_move_by_known_token_counts(server):
    wait_idle(server)
    ids = server.engine.tokenizer.encode("hello world, the cat sat on the mat and the capital of France is Paris")
    ids = (ids * 4)[:40]
    req = {"model": MODEL_NAME, "prompt": ids, "max_tokens": 7, "n": 2, "temperature": 0.8, "seed": 2,
           "ignore_eos": True}
    with server.client() as http:
        before = metric_values(http)
        first = http.post("/v1/completions", json=req).json()
        second = http.post("/v1/completions", json=req).json()
        after = metric_values(http)
    delta = {k: after[k] - before.get(k, 0.0) for k in after}
    assert first["usage"]["completion_tokens"] == 14 and first["usage"]["prompt_tokens"] == 40
    assert delta["samebits:prompt_tokens_total"] == 80
    assert delta["samebits:generation_tokens_total"] == 28
    assert delta["samebits:requests_finished_total"] == 2
    assert delta["samebits:time_to_first_token_seconds_count"] == 2
    assert delta["samebits:e2e_request_latency_seconds_count"] == 2
    assert delta["samebits:prefix_cache_queries_total"] > 0
    assert delta["samebits:prefix_cache_hits_total"] >= 32  # the second run reuses the first's two full blocks
    assert second["usage"]["prompt_tokens_details"]["cached_tokens"] >= 32
    assert second["choices"][0]["token_ids"] == first["choices"][0]["token_ids"]  # cold vs hot prefix cache
    assert after["samebits:num_requests_running"] == 0 and after["samebits:kv_cache_usage_perc"] == 0


def test_abandoned_requests_are_aborted_and_free_their_blocks(server):
    wait_idle(server)
    with server.client() as http:
        before = metric_values(http)

    added_before = server.async_engine.counters.requests_added

    async def abandon():
        leave = asyncio.Event()
        limits = httpx.Limits(max_connections=256)
        async with httpx.AsyncClient(base_url=server.url, timeout=30, limits=limits) as http:
            async def one(i):
                b = {**body(i, stream=i % 2 == 1, max_tokens=200), "ignore_eos": True}
                req = asyncio.ensure_future(http.post("/v1/completions", json=b))
                # A total deadline (httpx's own timeouts are per read, which a live stream never trips).
                await asyncio.wait({req, asyncio.ensure_future(leave.wait())}, timeout=ABANDON_AFTER_S,
                                   return_when=asyncio.FIRST_COMPLETED)
                if req.done():
                    return req.result().status_code
                req.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await req
                return "abandoned"

            async def leave_once_all_running():
                # Leave once they hold KV blocks, not on a clock alone, so a faster engine cannot finish them first.
                ae = server.async_engine
                while ae.counters.requests_added - added_before < 200 or getattr(ae.stats, "num_running", 0) < 64:
                    await asyncio.sleep(0.01)
                leave.set()

            watcher = asyncio.ensure_future(leave_once_all_running())
            results = await asyncio.gather(*(one(i) for i in range(200)))
            watcher.cancel()
            return results

    with PeakRunning(server.async_engine) as peak:
        results = asyncio.run(abandon())
    assert results.count("abandoned") >= 190, (results, server.async_engine.counters, server.async_engine.stats)
    assert peak.peak >= 32, (peak.peak, results, server.async_engine.counters, server.async_engine.stats)
    start = time.monotonic()
    with server.client(timeout=5) as http:
        r = http.post("/v1/completions", json={"model": MODEL_NAME, "prompt": "hello", "max_tokens": 3})
        assert r.status_code == 200 and time.monotonic() - start < 5
        wait_idle(server, timeout=5)
        after = metric_values(http)
    assert after["samebits:kv_cache_usage_perc"] == 0.0
    assert server.async_engine.stats.kv_usage == 0.0 and not server.engine.has_unfinished_requests()
    assert after["samebits:client_disconnects_total"] - before["samebits:client_disconnects_total"] >= 190
    assert after["samebits:requests_aborted_total"] - before["samebits:requests_aborted_total"] >= 100
    assert server.healthy()


def test_preemption_under_a_small_kv_pool_keeps_the_bits(server, tiny_model_dir):
    from samebits.engine.config import EngineConfig
    from samebits.engine.llm_engine import LLMEngine
    from tests.server.conftest import start_server

    small = start_server(LLMEngine(EngineConfig(model=str(tiny_model_dir), device="cpu", kv_cache_tokens=256,
                                                max_model_len=256)))
    reqs = [{**body(i, stream=False, max_tokens=40), "ignore_eos": True} for i in range(8)]
    try:
        async def together(url):
            async with httpx.AsyncClient(base_url=url, timeout=120) as http:
                rs = await asyncio.gather(*(http.post("/v1/completions", json=r) for r in reqs))
                return [r.json()["choices"][0] for r in rs]

        squeezed = asyncio.run(together(small.url))
        with small.client() as http:
            preempted = metric_values(http)["samebits:num_preemptions_total"]
        with server.client() as http:
            ample = [http.post("/v1/completions", json=r).json()["choices"][0] for r in reqs]
    finally:
        small.stop()
    assert preempted > 0, "the small pool never forced a preemption"
    assert [(c["token_ids"], c["logprobs"]) for c in squeezed] == [(c["token_ids"], c["logprobs"]) for c in ample]
