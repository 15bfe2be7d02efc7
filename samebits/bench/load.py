"""One workload through an engine, all requests at t=0: outputs by index, throughput, TTFT, inter-token latency and
the time inside the step by its kind (steplog.py)."""
from __future__ import annotations

import time
from collections.abc import Callable

from samebits.bench.steplog import StepLog
from samebits.bench.workload import Workload, request_params


def sync(engine) -> None:
    """Wait for the device: a CUDA run's last kernels count in its time."""
    import torch

    if engine.runner.device.type == "cuda":
        torch.cuda.synchronize(engine.runner.device)


def run_load(engine, work: Workload, seed: int = 0, finished: Callable[[int], None] | None = None) -> tuple:
    """-> (outputs in request order, stats). `finished(n)` after each step that finished n requests."""
    first, done = {}, {}
    with StepLog(engine) as log:
        t0 = time.perf_counter()
        for i, (prompt, m) in enumerate(zip(work.prompts, work.max_tokens)):
            engine.add_request(str(i), prompt, request_params(i, m, seed))
        while engine.has_unfinished_requests():
            ended = 0
            for out in engine.step():
                now = time.perf_counter() - t0
                if out.outputs[0].token_ids:
                    first.setdefault(out.request_id, now)
                if out.finished:
                    done[out.request_id], ended = (out, now), ended + 1
            if finished is not None and ended:
                finished(ended)
        sync(engine)
        total = time.perf_counter() - t0
    outs = [done[str(i)][0] for i in range(len(work))]
    return outs, _stats(work, outs, first, [done[str(i)][1] for i in range(len(work))], total, log.summary(t0, t0 + total))


def _stats(work: Workload, outs: list, first: dict, ends: list[float], total: float, steps: dict) -> dict:
    gen = sum(len(o.outputs[0].token_ids) for o in outs)
    itl = [(end - first[str(i)]) / max(1, m - 1) for i, (end, m) in enumerate(zip(ends, work.max_tokens))]
    return {"seconds": total, "output_tok_per_s": gen / total, "ttft_mean_s": sum(first.values()) / len(first),
            "itl_mean_ms": 1e3 * sum(itl) / len(itl), "generated_tokens": gen, "steps": steps}
