"""AsyncEngine on its own: outputs, abort, the bounded queue, loop death, and an event loop that never blocks."""
from __future__ import annotations

import asyncio
import contextlib
import time

import pytest

from samebits.engine.async_engine import AsyncEngine, EngineDead, QueueFull
from samebits.engine.sampling_params import SamplingParams
from tests.server.fake_engine import FakeLLMEngine


def run(coro_fn, engine=None, **kw):
    async def main():
        ae = AsyncEngine(engine or FakeLLMEngine(), **kw)
        try:
            return await coro_fn(ae)
        finally:
            ae.shutdown()

    return asyncio.run(main())


async def drain(ae, rid, ids=(1, 2, 3), **params):
    outs = [o async for o in ae.generate(rid, list(ids), SamplingParams(**params))]
    return outs


def test_generate_yields_cumulative_outputs_until_finished():
    async def body(ae):
        outs = await drain(ae, "a", max_tokens=5, temperature=0)
        assert outs[-1].finished and not any(o.finished for o in outs[:-1])
        ids = outs[-1].outputs[0].token_ids
        assert len(ids) == 5 and all(o.outputs[0].token_ids == ids[: len(o.outputs[0].token_ids)] for o in outs)
        assert ae.counters.generation_tokens == 5 and ae.counters.prompt_tokens == 3
        assert ae.counters.requests_finished == 1

    run(body)


def test_closing_early_aborts_and_frees():
    engine = FakeLLMEngine(step_delay_s=0.005)

    async def body(ae):
        async with contextlib.aclosing(ae.generate("a", [1, 2], SamplingParams(max_tokens=200))) as it:
            async for out in it:
                if len(out.outputs[0].token_ids) >= 2:
                    break
        await ae.abort("never-existed")  # a barrier: the abort queued by the close has been applied before this one
        assert not engine.requests and engine.stats().kv_usage == 0
        assert ae.counters.requests_aborted == 1

    run(body, engine)


def test_abort_ends_the_stream():
    engine = FakeLLMEngine(step_delay_s=0.005)

    async def body(ae):
        async def consume():
            return [o async for o in ae.generate("a", [1], SamplingParams(max_tokens=250))]

        task = asyncio.ensure_future(consume())
        await asyncio.sleep(0.05)
        await ae.abort("a")
        outs = await asyncio.wait_for(task, 5)
        assert outs and not outs[-1].finished and not engine.requests

    run(body, engine)


def test_bounded_queue_raises_queue_full():
    engine = FakeLLMEngine()
    engine.gate = __import__("threading").Event()

    async def body(ae):
        started = [asyncio.ensure_future(drain(ae, f"r{i}", max_tokens=2)) for i in range(2)]
        await asyncio.sleep(0.05)
        with pytest.raises(QueueFull):
            await drain(ae, "r3", max_tokens=2)
        engine.gate.set()
        assert all(o[-1].finished for o in await asyncio.gather(*started))
        assert ae.counters.requests_rejected == 1

    run(body, engine, max_waiting=2)


def test_bad_request_raises_value_error_and_loop_lives():
    async def body(ae):
        with pytest.raises(ValueError, match="max_model_len"):
            await drain(ae, "a", ids=[1] * 300, max_tokens=5)
        assert ae.healthy and (await drain(ae, "b", max_tokens=2))[-1].finished

    run(body)


def test_duplicate_request_id_is_refused():
    engine = FakeLLMEngine(step_delay_s=0.01)

    async def body(ae):
        first = asyncio.ensure_future(drain(ae, "same", max_tokens=5))
        await asyncio.sleep(0)
        with pytest.raises(ValueError, match="already in use"):
            await drain(ae, "same", max_tokens=5)
        await first

    run(body, engine)


def test_loop_death_fails_waiters_and_marks_unhealthy():
    engine = FakeLLMEngine()
    engine.fail_at_step = 2

    async def body(ae):
        with pytest.raises(EngineDead, match="injected"):
            await drain(ae, "a", max_tokens=50)
        await asyncio.sleep(0.05)
        assert not ae.healthy and isinstance(ae.error, RuntimeError)
        with pytest.raises(EngineDead):
            await drain(ae, "b")

    run(body, engine)


def test_event_loop_stays_responsive_during_slow_steps():
    engine = FakeLLMEngine(step_delay_s=0.2)

    async def body(ae):
        gen = asyncio.ensure_future(drain(ae, "a", max_tokens=4))
        worst = 0.0
        while not gen.done():
            t = time.monotonic()
            await asyncio.sleep(0.01)
            worst = max(worst, time.monotonic() - t)
        await gen
        assert worst < 0.15, f"the event loop stalled {worst:.3f}s behind a 0.2s step"

    run(body, engine)


def test_shutdown_fails_waiting_requests_instead_of_hanging():
    engine = FakeLLMEngine(step_delay_s=0.01)

    async def body(ae):
        task = asyncio.ensure_future(drain(ae, "a", max_tokens=250))
        await asyncio.sleep(0.05)
        await asyncio.to_thread(ae.shutdown)
        with pytest.raises(EngineDead, match="shut down"):
            await asyncio.wait_for(task, 5)

    run(body, engine)


def test_final_only_yields_just_the_last_output_and_hooks_fire():
    seen = {"first": [], "done": []}

    async def body(ae):
        ae.on_first_output = seen["first"].append
        ae.on_finished = seen["done"].append
        outs = [o async for o in ae.generate("a", [1, 2], SamplingParams(max_tokens=6), final_only=True)]
        assert len(outs) == 1 and outs[0].finished and len(outs[0].outputs[0].token_ids) == 6
        assert ae.counters.generation_tokens == 6

    run(body, FakeLLMEngine(step_delay_s=0.002))
    assert len(seen["first"]) == 1 and len(seen["done"]) == 1 and 0 <= seen["first"][0] <= seen["done"][0]


def test_abort_after_loop_death_returns_at_once():
    engine = FakeLLMEngine()
    engine.fail_at_step = 1

    async def body(ae):
        with pytest.raises(EngineDead):
            await drain(ae, "a")
        await asyncio.sleep(0.05)
        await asyncio.wait_for(ae.abort("a"), 1)

    run(body, engine)
