"""AsyncEngine on its own: outputs, abort, the bounded queue, loop death, and an event loop that never blocks."""
from __future__ import annotations

import asyncio
import contextlib
import threading

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


async def drain(ae, rid, ids=(1, 2, 3), first: asyncio.Event | None = None, **params):
    """All outputs of one request; `first` is set when the first one arrives."""
    outs = []
    async for o in ae.generate(rid, list(ids), SamplingParams(**params)):
        outs.append(o)
        if first is not None:
            first.set()
    return outs


class CountingEngine(FakeLLMEngine):
    """Sets `added` once `expect` requests have been added on the engine thread (their streams exist by then)."""

    def __init__(self, expect: int, **kw):
        super().__init__(**kw)
        self.expect, self.added = expect, threading.Event()

    def add_request(self, *args, **kw) -> None:
        super().add_request(*args, **kw)
        self.expect -= 1
        if self.expect == 0:
            self.added.set()


class HandshakeEngine(FakeLLMEngine):
    """Each step waits until the event loop has run a callback, so a step that blocked the loop would hang here."""

    loop: asyncio.AbstractEventLoop | None = None
    stalled = 0
    timeout_s = 30.0  # a bound that only keeps a broken loop from hanging the suite

    def step(self):
        answered = threading.Event()
        self.loop.call_soon_threadsafe(answered.set)
        self.stalled += not answered.wait(self.timeout_s)
        return super().step()


async def stopped(ae) -> None:
    """Wait for the engine thread to end (a dead loop), without blocking the event loop."""
    await asyncio.to_thread(ae._thread.join, 30)


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
        first = asyncio.Event()
        task = asyncio.ensure_future(drain(ae, "a", ids=[1], first=first, max_tokens=250))
        await first.wait()
        await ae.abort("a")
        outs = await asyncio.wait_for(task, 5)
        assert outs and not outs[-1].finished and not engine.requests

    run(body, engine)


def test_bounded_queue_raises_queue_full():
    engine = CountingEngine(expect=2)
    engine.gate = threading.Event()

    async def body(ae):
        started = [asyncio.ensure_future(drain(ae, f"r{i}", max_tokens=2)) for i in range(2)]
        await asyncio.to_thread(engine.added.wait, 30)
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
    engine = CountingEngine(expect=1, step_delay_s=0.01)

    async def body(ae):
        first = asyncio.ensure_future(drain(ae, "same", max_tokens=5))
        await asyncio.to_thread(engine.added.wait, 30)
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
        await stopped(ae)
        assert not ae.healthy and isinstance(ae.error, RuntimeError)
        with pytest.raises(EngineDead):
            await drain(ae, "b")

    run(body, engine)


def test_event_loop_stays_responsive_during_steps():
    engine = HandshakeEngine()

    async def body(ae):
        engine.loop = asyncio.get_running_loop()
        assert (await drain(ae, "a", max_tokens=4))[-1].finished
        assert engine.steps >= 4 and engine.stalled == 0, "a step ran while the event loop could not"

    run(body, engine)


def test_negative_control_a_loop_blocked_by_the_step_is_caught():
    engine = HandshakeEngine()

    async def body():
        engine.loop = asyncio.get_running_loop()
        engine.add_request("a", [1, 2], SamplingParams(max_tokens=2))
        engine.timeout_s = 0.05
        engine.step()  # the mistake: stepping on the loop itself, so the loop cannot answer
        assert engine.stalled == 1

    asyncio.run(body())


def test_shutdown_fails_waiting_requests_instead_of_hanging():
    engine = FakeLLMEngine(step_delay_s=0.01)

    async def body(ae):
        first = asyncio.Event()
        task = asyncio.ensure_future(drain(ae, "a", first=first, max_tokens=250))
        await first.wait()
        await asyncio.to_thread(ae.shutdown)
        with pytest.raises(EngineDead, match="shut down"):
            await asyncio.wait_for(task, 5)

    run(body, engine)


class KindRecorder(FakeLLMEngine):
    """Records the output kind each request reached the engine with."""

    def add_request(self, request_id, prompt_token_ids, params, prompt=None, resume=None) -> None:
        self.kinds = {**getattr(self, "kinds", {}), request_id: params.output_kind}
        super().add_request(request_id, prompt_token_ids, params, prompt, resume)


def test_final_only_yields_just_the_last_output_and_hooks_fire():
    """A final_only request asks the engine for FINAL_ONLY outputs (none built between), yet every token is counted
    and the latency hooks fire, from the engine's progress; a streamed request stays CUMULATIVE (the control)."""
    from samebits.engine.sampling_params import RequestOutputKind

    seen = {"first": [], "done": []}
    engine = KindRecorder(step_delay_s=0.002)

    async def body(ae):
        ae.on_first_output = seen["first"].append
        ae.on_finished = seen["done"].append
        outs = [o async for o in ae.generate("a", [1, 2], SamplingParams(max_tokens=6), final_only=True)]
        assert len(outs) == 1 and outs[0].finished and len(outs[0].outputs[0].token_ids) == 6
        assert ae.counters.generation_tokens == 6
        streamed = [o async for o in ae.generate("b", [1, 2], SamplingParams(max_tokens=6))]
        assert len(streamed) > 1 and ae.counters.generation_tokens == 12

    run(body, engine)
    assert engine.kinds == {"a": RequestOutputKind.FINAL_ONLY, "b": RequestOutputKind.CUMULATIVE}
    assert len(seen["first"]) == 2 and len(seen["done"]) == 2 and 0 <= seen["first"][0] <= seen["done"][0]


def test_abort_after_loop_death_returns_at_once():
    engine = FakeLLMEngine()
    engine.fail_at_step = 1

    async def body(ae):
        with pytest.raises(EngineDead):
            await drain(ae, "a")
        await stopped(ae)
        await asyncio.wait_for(ae.abort("a"), 30)  # returns at once; the bound only keeps a bug from hanging

    run(body, engine)


def test_call_runs_on_the_engine_thread_with_its_result_or_error():
    async def main(ae):
        ae.start()
        where = await ae.call(lambda engine: (threading.current_thread().name, engine is ae.engine))
        with pytest.raises(ZeroDivisionError):
            await ae.call(lambda engine: 1 / 0)
        alive = ae.healthy  # a failed call fails that call, never the loop
        ae.shutdown()
        with pytest.raises(EngineDead):
            await ae.call(lambda engine: None)
        return where, alive

    assert run(main) == (("samebits-engine", True), True)


@pytest.mark.parametrize("abort", [True, False], ids=["aborted", "control"])
def test_an_abort_mid_prefill_takes_effect_at_the_next_step(tiny_model_dir, monkeypatch, abort):
    """A client that leaves during a long prefill (the real engine, 64-token steps of a 240-token prompt): its
    abort, queued while a step of the prompt's chunk runs, is applied at the next step boundary, so no later step
    runs the prompt and a short request after it is served. Negative control: not aborted, the next step goes on
    with the long prompt's next chunk."""
    from samebits.engine.config import EngineConfig
    from samebits.engine.llm_engine import LLMEngine

    engine = LLMEngine(EngineConfig(model=str(tiny_model_dir), device="cpu", max_model_len=512,
                                    max_num_batched_tokens=64))
    steps, held, go = [], threading.Event(), threading.Event()
    real_step = engine.step

    def step():
        """The step, recording the requests it computed tokens of."""
        seqs = {rid: list(group) for rid, group in engine.scheduler.requests.items()}
        before = {rid: sum(s.num_computed_tokens for s in group) for rid, group in seqs.items()}
        outs = real_step()
        steps.append([rid for rid, group in seqs.items() if sum(s.num_computed_tokens for s in group) != before[rid]])
        if len(steps) == 1:  # the long prompt's first chunk: held until the test has (or has not) aborted it
            held.set()
            go.wait(30)
        return outs

    monkeypatch.setattr(engine, "step", step)

    async def body(ae):
        long = asyncio.ensure_future(drain(ae, "long", [5 + i % 200 for i in range(240)], max_tokens=1))
        await asyncio.to_thread(held.wait, 30)
        if abort:
            long.cancel()  # as the server does when the client disconnects: the generator's exit queues the abort
            with contextlib.suppress(asyncio.CancelledError):
                await long
        go.set()
        short = await drain(ae, "short", (7, 9), max_tokens=1)
        return short, None if abort else await long

    short, long = run(body, engine)
    assert steps[0] == ["long"] and short[-1].finished
    if abort:
        assert not any("long" in s for s in steps[1:]), steps
        assert engine.scheduler.bm.num_free_blocks == engine.scheduler.bm.num_blocks
    else:
        assert "long" in steps[1] and long[-1].finished, steps
