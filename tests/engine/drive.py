"""An LLMEngine driven to idle in a test: requests added as r0, r1, ... in order, stepped until none is left."""
from __future__ import annotations

from collections.abc import Callable


def drive(eng, reqs, on_output: Callable | None = None, on_step: Callable | None = None) -> dict:
    """request id -> its final RequestOutput; `on_output(out)` sees every output, `on_step(eng)` runs after each step."""
    for i, (prompt, params) in enumerate(reqs):
        eng.add_request(f"r{i}", prompt, params)
    final = {}
    while eng.has_unfinished_requests():
        for out in eng.step():
            if on_output is not None:
                on_output(out)
            if out.finished:
                final[out.request_id] = out
        if on_step is not None:
            on_step(eng)
    return final
