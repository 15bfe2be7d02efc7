"""samebits.engine."""

# Lazy, so importing a torch-free piece (config, scheduler) never pulls in torch through the runner or the LLM.
_LAZY = {
    "LLM": "samebits.engine.llm",
    "LLMEngine": "samebits.engine.llm_engine",
    "AsyncEngine": "samebits.engine.async_engine",
    "SamplingParams": "samebits.engine.sampling_params",
    "StructuredOutputsParams": "samebits.structured.params",
    "RequestOutput": "samebits.engine.outputs",
    "CompletionOutput": "samebits.engine.outputs",
    "EngineConfig": "samebits.engine.config",
    "Scheduler": "samebits.engine.scheduler",
    "SchedulerOutput": "samebits.engine.scheduler",
    "ScheduledSeq": "samebits.engine.scheduler",
    "QueueFull": "samebits.engine.scheduler",
    "BlockManager": "samebits.engine.scheduler",
    "OutputProcessor": "samebits.engine.output_processor",
    "Sequence": "samebits.engine.sequence",
    "SequenceStatus": "samebits.engine.sequence",
    "Finish": "samebits.engine.sequence",
}

__all__ = list(_LAZY)


def __getattr__(name):
    if name not in _LAZY:
        raise AttributeError(f"module 'samebits.engine' has no attribute {name!r}")
    import importlib

    return getattr(importlib.import_module(_LAZY[name]), name)
