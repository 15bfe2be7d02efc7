"""A fleet of two replicas on a local Ray cluster behind one server: every answer bit-equal to one replica's, a
replica of another mode refused, a replica killed mid-load without a changed answer (streams resumed), a weight
update under load with no response mixing versions. One cluster and fleet for the module (Ray starts slowly)."""
from __future__ import annotations

import importlib.util
import json
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

if importlib.util.find_spec("ray") is None or importlib.util.find_spec("fastapi") is None:
    pytest.skip("needs ray and the server stack", allow_module_level=True)

import httpx
import torch

from samebits.engine.config import EngineConfig
from samebits.fleet import cluster
from samebits.fleet.identity import IdentityError, check_identity
from samebits.models.synthetic import write_tiny_checkpoint

KEY = "fleet-test-key"
REPLICAS = 2


def engine_config(ckpt, **kw) -> EngineConfig:
    kw = {"mode": "deterministic", **kw}
    return EngineConfig(model=str(ckpt), device="cpu", max_model_len=256, max_waiting=256, **kw)


def serve(async_engine, **overrides):
    from samebits.server.app import build_app
    from samebits.server.config import ServerConfig
    from samebits.server.serve import ServerThread

    config = ServerConfig.from_dict({"model": "tiny", "port": 0, "log_level": "warning", "max_n": 4, **overrides})
    thread = ServerThread(build_app(async_engine, config), config)
    return thread, thread.url


@pytest.fixture(scope="module")
def ckpts(tmp_path_factory):
    root = tmp_path_factory.mktemp("fleet")
    return write_tiny_checkpoint(root / "a", "llama3", seed=0), write_tiny_checkpoint(root / "b", "llama3", seed=1)


@pytest.fixture(scope="module")
def solo(ckpts):
    """One engine in this process, with a replica's one torch thread (the thread count is in the fingerprint)."""
    from samebits.engine.async_engine import AsyncEngine
    from samebits.engine.llm_engine import LLMEngine

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        thread, url = serve(AsyncEngine(LLMEngine(engine_config(ckpts[0])), max_waiting=256))
        yield url
        thread.stop()
    finally:
        torch.set_num_threads(threads)


@pytest.fixture(scope="module")
def fleet(ckpts):
    """Two replicas of one CPU thread each; three logical CPUs, so a third replica can be placed beside them."""
    from samebits.fleet.engine import FleetEngine

    changed = cluster.connect(None, num_cpus=REPLICAS + 1)
    try:
        engine = FleetEngine(engine_config(ckpts[0], data_parallel_size=REPLICAS), max_waiting=256)
        thread, url = serve(engine, api_keys=[KEY])
        yield engine, url
        thread.stop()
    finally:
        cluster.disconnect(changed)


def request(i: int, max_tokens: int = 8) -> tuple[str, dict]:
    """A mix: completions and chat, streamed or not, greedy or seeded, n 1 or 2, with logprobs or without."""
    body = {"model": "tiny", "max_tokens": max_tokens + i % 5, "stream": i % 2 == 0, "ignore_eos": True}
    # Greedy ones send a seed too: a drawn one is reported back, and two servers draw their own.
    if i % 4 >= 2:
        body.update(temperature=0.9, top_p=0.9, seed=1000 + i, n=1 + i % 3 // 2)
    else:
        body.update(temperature=0.0, seed=i)
    if i % 3 == 0:
        body.update(logprobs=2 if i % 8 else None, top_logprobs=2 if i % 8 == 0 else None)
    words = " ".join(f"w{(i * 7 + k) % 23}" for k in range(6 + i % 9))
    if i % 8 == 0:
        return "/v1/chat/completions", {**body, "messages": [{"role": "user", "content": words}],
                                        "logprobs": True, "top_logprobs": 2}
    if body.get("logprobs") is None:
        body.pop("logprobs", None)
    body.pop("top_logprobs", None)
    return "/v1/completions", {**body, "prompt": words}


def call(url: str, path: str, body: dict, on_chunk=None) -> dict:
    """The response without its id and time: the whole body, or a stream's chunks in order."""
    headers = {"Authorization": f"Bearer {KEY}"}
    with httpx.Client(base_url=url, timeout=120, headers=headers) as client:
        if not body["stream"]:
            r = client.post(path, json=body)
            assert r.status_code == 200, r.text
            return _strip(r.json()) | {"done": time.monotonic()}
        chunks = []
        with client.stream("POST", path, json=body) as r:
            assert r.status_code == 200, r.read()
            for line in r.iter_lines():
                if line.startswith("data: ") and line != "data: [DONE]":
                    chunks.append(_strip(json.loads(line[6:])))
                    if on_chunk is not None:
                        on_chunk(len(chunks))
        return {"chunks": chunks, "done": time.monotonic()}


def _strip(body: dict) -> dict:
    """Without its id and time, and without the prefix cache's hits, which follow what the replica ran before."""
    usage = body.get("usage") or {}
    if usage.get("prompt_tokens_details"):
        body = {**body, "usage": {k: v for k, v in usage.items() if k != "prompt_tokens_details"}}
    return {k: v for k, v in body.items() if k not in ("id", "created")}


def same(a: dict, b: dict) -> bool:
    """Equal bodies; for streams, equal choices once each choice's chunks are joined (how tokens are grouped into
    chunks follows the reader's pace, in any server) and equal chunk heads."""
    if "chunks" not in a:
        return {k: v for k, v in a.items() if k != "done"} == {k: v for k, v in b.items() if k != "done"}
    return joined(a["chunks"]) == joined(b["chunks"])


def joined(chunks: list[dict]) -> tuple:
    heads = {json.dumps({k: v for k, v in c.items() if k not in ("choices", "usage")}, sort_keys=True) for c in chunks}
    choices: dict[int, dict] = {}
    for chunk in chunks:
        for choice in chunk["choices"]:
            choices[choice["index"]] = _join(choices.get(choice["index"], {}), choice)
    return heads, choices


def _join(into: dict, part: dict) -> dict:
    out = dict(into)
    for k, v in part.items():
        old = out.get(k)
        text = isinstance(v, str) and isinstance(old, str) and k != "finish_reason"
        if text or (isinstance(v, list) and isinstance(old, list)):
            out[k] = old + v
        elif isinstance(v, dict) and isinstance(old, dict):
            out[k] = _join(old, v)
        elif v is not None or k not in out:
            out[k] = v
    return out


def fingerprints(response: dict) -> set[str]:
    return {c["system_fingerprint"] for c in response.get("chunks", [response])}


def run_all(url: str, reqs: list, on_chunk=None) -> list[dict]:
    with ThreadPoolExecutor(len(reqs)) as pool:
        return list(pool.map(lambda r: call(url, *r, on_chunk=on_chunk), reqs))


def test_every_answer_is_one_replicas_answer(fleet, solo):
    engine, url = fleet
    reqs = [request(i) for i in range(32)]
    together = run_all(url, reqs)
    alone = [call(solo, *r) for r in reqs]
    for t, a in zip(together, alone):
        assert same(t, a), (t, a)
    assert {fp for r in together for fp in fingerprints(r)} == {engine.identity["hash"]}
    assert all(r["routed"] > 0 for r in engine.health()["replicas"])  # both replicas answered some


def test_a_replica_of_another_mode_is_refused(fleet, ckpts):
    engine, _ = fleet
    actor = cluster.spawn(engine_config(ckpts[0], mode="fast"), threads=1)
    try:
        fast = cluster.ready(actor, 120)[2]
    finally:
        cluster.kill(actor, restart=False)
    with pytest.raises(IdentityError, match="mode: fleet 'deterministic', replica 'fast'"):
        check_identity(engine.identity, fast, "replica 2")
    check_identity(engine.identity, engine.clients[1].engine.fingerprint(), "replica 1")  # the control


def test_killing_a_replica_mid_load_changes_no_answer(fleet, solo):
    engine, url = fleet
    reqs = [request(i, max_tokens=40) for i in range(16)]
    streams = sum(body["stream"] for _, body in reqs)
    started, lock, seen = threading.Event(), threading.Lock(), set()

    def on_chunk(n: int) -> None:
        if n == 4:  # this stream has sent tokens: a kill now must resume it
            with lock:
                seen.add(threading.get_ident())
                if len(seen) == streams:
                    started.set()

    before = engine.health()
    with ThreadPoolExecutor(len(reqs)) as pool:
        futures = [pool.submit(call, url, *r, on_chunk) for r in reqs]
        assert started.wait(120)
        victim = max(engine.health()["replicas"], key=lambda r: r["requests"])
        os.kill(cluster.pid(engine.actors[victim["replica"]]), signal.SIGKILL)
        together = [f.result() for f in futures]
    assert all(same(t, call(solo, *r)) for t, r in zip(together, reqs))
    health = engine.health()
    assert health["resumed"] > before["resumed"]  # streams went on from their last token elsewhere
    deadline = time.monotonic() + 120
    while engine.health()["replicas"][victim["replica"]]["state"] != "up":
        assert time.monotonic() < deadline, engine.health()
        time.sleep(0.2)
    back = engine.health()["replicas"][victim["replica"]]
    assert back["pid"] != victim["pid"] and back["restarts"] == victim["restarts"] + 1
    assert same(call(url, *reqs[1]), call(solo, *reqs[1]))  # the restarted replica answers alike


def test_a_weight_update_under_load_mixes_no_versions(fleet, ckpts):
    engine, url = fleet
    old = engine.identity["hash"]
    reqs = [request(i, max_tokens=24) for i in range(16)]
    first_chunk = threading.Event()
    headers = {"Authorization": f"Bearer {KEY}"}

    def update(path) -> dict:
        r = httpx.post(f"{url}/admin/update_weights", json={"path": str(path)}, headers=headers, timeout=120)
        assert r.status_code == 200, r.text
        return r.json()

    with ThreadPoolExecutor(len(reqs) + 1) as pool:
        early = [pool.submit(call, url, *r, lambda n: first_chunk.set()) for r in reqs[:8]]
        assert first_chunk.wait(120)
        updated = pool.submit(update, ckpts[1])
        late = [pool.submit(call, url, *r) for r in reqs[8:]]
        results = [f.result() for f in early + late]
        new = updated.result()["fingerprint"]
    assert new != old
    assert all(len(fingerprints(r)) == 1 for r in results)  # no response mixes versions
    order = [fingerprints(r).pop() for r in sorted(results, key=lambda r: r["done"])]
    assert order == sorted(order, key=lambda fp: fp == new) and set(order) == {old, new}  # one step, old to new
    again = run_all(url, reqs)  # the new version's answers, with nothing else in flight
    assert all(same(r, a) for r, a in zip(results, again) if fingerprints(r) == {new})
    assert update(ckpts[0])["fingerprint"] == old  # the first weights again: the first fingerprint
    assert {r["state"] for r in engine.health()["replicas"]} == {"up"}


def test_replica_stats_add_up_per_position_counts():
    """EngineStats over replicas: counts summed, speculative decoding's per-position counts position by position."""
    from samebits.fleet.engine import _total

    assert _total([(1, 2, 0), (3, 4, 1)]) == (4, 6, 1) and _total([(), ()]) == () and _total([2, 3]) == 5
