"""Each engine step's wall time, by the kind of step it launched (prefill, decode, mixed): where a run's time goes.

With async scheduling a step launches step N+1 and reads back step N, so a row's time is that of the call that
launched its schedule; summed by kind it still adds up to the time spent inside `engine.step`. What is left of the
wall time is the caller's, between steps: host work the engine does not see. Each step's work (the chunks it ran:
bench/roofline.py StepWork) is kept too, for the step-max roofline of the steps actually launched.
"""
from __future__ import annotations

import statistics
import time
from typing import Self

from samebits.bench.roofline import step_work


class StepLog:
    """`with StepLog(engine) as log:` engine.step and engine.scheduler.schedule wrapped, restored on exit; a row
    (start, seconds, kind, batched tokens, rows, StepWork) per step."""

    def __init__(self, engine) -> None:
        self.engine = engine
        self.step, self.schedule = engine.step, engine.scheduler.schedule
        self.rows: list[tuple] = []
        self._launched: list = []

    def __enter__(self) -> Self:
        self.engine.step, self.engine.scheduler.schedule = self, self._scheduled
        return self

    def __exit__(self, *exc) -> None:
        self.engine.step, self.engine.scheduler.schedule = self.step, self.schedule

    def _scheduled(self, drafts=None):
        out = self.schedule(drafts)
        self._launched.append(out)
        return out

    def __call__(self):
        start = time.perf_counter()
        self._launched.clear()
        out = self.step()
        launched = self._launched[-1] if self._launched else None
        kind = launched.kind if launched is not None else "empty"
        tokens = launched.num_batched_tokens if launched is not None else 0
        chunks = launched.scheduled if launched is not None else []
        work = step_work((c.num_new_tokens, c.start, c.sample) for c in chunks)
        self.rows.append((start, time.perf_counter() - start, kind, tokens, len(chunks), work))
        return out

    def summary(self, since: float, until: float) -> dict:
        """`work`: per step [kind, tokens, samples, pairs, keys] (StepWork's fields)."""
        rows = [r for r in self.rows if since <= r[0] < until]
        busy = sum(r[1] for r in rows)
        kinds = {}
        for kind in sorted({r[2] for r in rows}):
            of = [r for r in rows if r[2] == kind]
            kinds[kind] = {"steps": len(of), "seconds": sum(r[1] for r in of),
                           "mean_ms": 1e3 * statistics.fmean(r[1] for r in of),
                           "mean_tokens": statistics.fmean(r[3] for r in of),
                           "mean_rows": statistics.fmean(r[4] for r in of)}
        return {"steps": len(rows), "in_step_s": busy, "between_steps_s": (until - since) - busy,
                "mean_step_ms": 1e3 * busy / max(1, len(rows)), "by_kind": kinds,
                "work": [[r[2], r[5].tokens, r[5].samples, r[5].pairs, r[5].keys] for r in rows]}
