"""`LLM(model, data_parallel_size=N)`: the offline API over a fleet. A batch is scattered over the replicas by the
router and gathered in prompt order; seeds a prompt does not send are drawn here in prompt order, from the same
stream one engine draws them from (`EngineConfig.seed`), so the outputs are those of `LLM(model)` bit for bit."""
from __future__ import annotations

import asyncio
import dataclasses
import itertools
import sys
import threading

from samebits.engine.config import EngineConfig
from samebits.engine.llm import LLM
from samebits.engine.outputs import RequestOutput
from samebits.engine.sampling_params import check_vocab


class FleetLLM(LLM):
    def __init__(self, model: str = "smollm2-135m", **engine_kwargs):
        from samebits.fleet.engine import FleetEngine

        self.config = EngineConfig.from_dict({"model": model, **engine_kwargs})
        # The offline API queues a whole batch at once, as one engine does (no waiting limit).
        self.fleet = FleetEngine(self.config, max_waiting=sys.maxsize)
        self.engine = self.fleet.engine
        self._ids = itertools.count()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="samebits-fleet-llm", daemon=True)
        self._thread.start()
        self._call(self._start())

    async def _start(self) -> None:
        self.fleet.start()

    def _call(self, coroutine):
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result()

    def generate(self, prompts=None, sampling_params=None, use_tqdm: bool = True, *,
                 prompt_token_ids=None) -> list[RequestOutput]:
        items = self._prompt_items(prompts, prompt_token_ids)
        params = self._params_per_prompt(sampling_params, len(items))
        for p in params:  # before any request is queued, so a bad one loses nothing
            check_vocab(p, self.engine.vocab_size)
        params = [p if p.seed is not None else dataclasses.replace(p, seed=self.engine.draw_seed()) for p in params]
        outs = self._call(self._gather(items, params))
        for out in outs:
            self._finish(out)
        return outs

    async def _gather(self, items, params) -> list[RequestOutput]:
        return list(await asyncio.gather(*(self._one(str(next(self._ids)), ids, p, text)
                                           for (text, ids), p in zip(items, params))))

    async def _one(self, request_id: str, ids: list[int], params, text) -> RequestOutput:
        last = None
        async for out in self.fleet.generate(request_id, ids, params, text, final_only=True):
            last = out
        return last

    def update_weights(self, weights, version: str | None = None) -> str:
        """New weights in every replica, or in none (FleetEngine.update_weights)."""
        return self._call(self.fleet.update_weights(weights, version))

    def teacher_forced_logprobs(self, prompt_token_ids, completion_token_ids):
        raise NotImplementedError("teacher_forced_logprobs runs on one engine: LLM(model) without "
                                  "data_parallel_size gives the same bits as any replica")

    def shutdown(self) -> None:
        """End the replicas (and the Ray cluster this fleet started)."""
        self.fleet.shutdown()
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
