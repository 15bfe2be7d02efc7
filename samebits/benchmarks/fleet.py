"""The router's added latency: the same requests through the plain server and through a fleet of one replica on Ray.

    python -m samebits.benchmarks.fleet --out /tmp/fleet          # CPU: a tiny random checkpoint, 32 concurrent

Each run fires `--rounds` rounds of `--concurrency` concurrent non-streamed completions (token-id prompts) at a
server on 127.0.0.1 and records each request's latency; the fleet's added latency per request is the difference of
the two runs' percentiles (p50, p99). Both engines compute on one torch thread. On a CPU the plain server's engine
thread shares the GIL with its HTTP work while a replica has its own process, so the difference there is that of
the two layouts, not Ray's cost alone (docs/FLEET.md). Writes fleet.json and fleet.png into --out.
"""
from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from pathlib import Path

import httpx

from samebits.benchmarks.results import figure, write_json


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--concurrency", type=int, default=32)
    p.add_argument("--rounds", type=int, default=8)
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


async def _latencies(url: str, concurrency: int, rounds: int, max_tokens: int) -> list[float]:
    async with httpx.AsyncClient(base_url=url, timeout=300) as http:
        async def one(i: int) -> float:
            t = time.perf_counter()
            r = await http.post("/v1/completions", json={"model": "bench", "prompt": [1 + i % 97, 2, 3, 4 + i % 5],
                                                         "max_tokens": max_tokens, "temperature": 0, "ignore_eos": True})
            r.raise_for_status()
            return time.perf_counter() - t

        await one(0)  # warm-up
        out: list[float] = []
        for r in range(rounds):
            out += await asyncio.gather(*(one(r * concurrency + i) for i in range(concurrency)))
        return out


def _serve(async_engine):
    from samebits.server.app import build_app
    from samebits.server.config import ServerConfig
    from samebits.server.serve import ServerThread

    config = ServerConfig.from_dict({"model": "bench", "port": 0, "log_level": "warning", "max_waiting": 1024})
    return ServerThread(build_app(async_engine, config), config)


def _measure(async_engine, args) -> list[float]:
    server = _serve(async_engine)
    try:
        return asyncio.run(_latencies(server.url, args.concurrency, args.rounds, args.max_tokens))
    finally:
        server.stop()


def pcts(values: list[float]) -> dict:
    q = statistics.quantiles(values, n=100, method="inclusive")
    return {"p50_ms": 1e3 * q[49], "p99_ms": 1e3 * q[98], "mean_ms": 1e3 * statistics.fmean(values)}


def plot(report: dict, path: Path) -> None:
    with figure(path, figsize=(6, 3.5)) as (_, ax):
        names = ["p50 plain", "p50 fleet", "p99 plain", "p99 fleet"]
        ax.bar(names, [report[run][q] for q in ("p50_ms", "p99_ms") for run in ("plain", "fleet")])
        ax.set_ylabel("ms per request")
        ax.set_title(f"{report['requests']} requests, {report['concurrency']} at once: "
                     "plain server vs one replica on Ray")


def main(argv=None) -> int:
    import torch

    from samebits.engine.async_engine import AsyncEngine
    from samebits.engine.config import EngineConfig
    from samebits.engine.llm_engine import LLMEngine
    from samebits.fleet import cluster
    from samebits.fleet.engine import FleetEngine
    from samebits.models.synthetic import write_tiny_checkpoint
    from samebits.runtime import runtime_for

    args = parse_args(argv)
    args.out.mkdir(parents=True, exist_ok=True)
    ckpt = write_tiny_checkpoint(Path(tempfile.mkdtemp()), "llama3", seed=0)
    config = EngineConfig(model=str(ckpt), mode="deterministic", device="cpu", max_model_len=256, max_waiting=1024)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with runtime_for("deterministic"):
            plain = _measure(AsyncEngine(LLMEngine(config), max_waiting=1024), args)
    finally:
        torch.set_num_threads(threads)
    ray_state = cluster.connect(None, num_cpus=1)
    try:
        fleet = _measure(FleetEngine(config.replace(data_parallel_size=1), max_waiting=1024), args)
    finally:
        cluster.disconnect(ray_state)
    report = {"concurrency": args.concurrency, "requests": len(plain), "max_tokens": args.max_tokens,
              "plain": pcts(plain), "fleet": pcts(fleet)}
    report["added"] = {k: report["fleet"][k] - report["plain"][k] for k in report["plain"]}
    write_json(report, args.out / "fleet.json")
    print(f"{'':8}{'p50 ms':>10}{'p99 ms':>10}{'mean ms':>10}")
    for name in ("plain", "fleet", "added"):
        r = report[name]
        print(f"{name:8}{r['p50_ms']:10.2f}{r['p99_ms']:10.2f}{r['mean_ms']:10.2f}")
    plot(report, args.out / "fleet.png")
    return 0


# samebits: deterministic because every server and replica it starts enters its mode's runtime itself
# (runtime/template.py); this entry point only sends requests and times them.
if __name__ == "__main__":
    raise SystemExit(main())
