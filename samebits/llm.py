"""`samebits.LLM`, vLLM's offline entry point: one engine (engine/llm.py), or with `data_parallel_size` > 1 replicas
behind a router (fleet/llm.py), the same calls and bits. It sits above both rooms, so neither imports the other."""
from __future__ import annotations

from samebits.engine.llm import LLM as EngineLLM
from samebits.fleet.llm import FleetLLM


class LLM(EngineLLM):
    def __new__(cls, model: str = "smollm2-135m", **engine_kwargs):
        if cls is LLM and engine_kwargs.get("data_parallel_size", 1) > 1:
            return FleetLLM(model, **engine_kwargs)
        return super().__new__(cls)
