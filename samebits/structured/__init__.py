"""Structured outputs: a request's grammar (params.py), compiled by llguidance against the model's vocabulary and
followed by one matcher per sample (grammar.py), masked row by row in the sampler (masks.py). docs/STRUCTURED.md."""
from samebits.structured.params import StructuredOutputsParams

__all__ = ["StructuredOutputsParams"]
