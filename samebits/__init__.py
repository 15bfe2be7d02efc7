"""samebits: an LLM inference engine whose every output is a function of the request alone."""
__version__ = "0.1.0"


def __getattr__(name):
    # Lazy so `import samebits` stays light (no torch) for the CLI's --help and for CPU-only tooling.
    if name in ("fingerprint", "deterministic_runtime", "write_lock", "verify_lock"):
        from samebits import runtime

        return getattr(runtime, name)
    if name == "batch_invariant":
        from samebits.kernels.dropin import batch_invariant

        return batch_invariant
    if name == "LLM":
        from samebits.llm import LLM

        return LLM
    if name in ("SamplingParams", "StructuredOutputsParams", "TextPrompt", "TokensPrompt", "RequestOutput",
                "CompletionOutput"):
        from samebits import engine

        return getattr(engine, name)
    raise AttributeError(f"module 'samebits' has no attribute {name!r}")
