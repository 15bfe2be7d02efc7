"""repeat: the needle request sent again between experiments (run to run, under whatever load preceded it), and,
with `--compare REPORT`, every reference request of an earlier report replayed and compared with its stored answer
(after a restart, a redeploy, a driver upgrade)."""
from __future__ import annotations

from samebits.check.client import BudgetExhausted, CheckError
from samebits.check.compare import summarize
from samebits.check.experiment import Request, Session, Trace
from samebits.check.needle import needle_prompt
from samebits.check.sample import Sample

NAME = "repeat"
MIN_SENDS = 3


def sends(other_experiments: int) -> int:
    """One before the first experiment and one after each, and never fewer than MIN_SENDS."""
    return max(MIN_SENDS, other_experiments + 1)


class Repeat:
    def __init__(self, session: Session, trace: Trace):
        self.session = session
        self.trace = trace
        self.request = session.request(needle_prompt(session))
        self.samples: list[Sample] = []
        self.failure: Exception | None = None

    async def tick_between(self) -> None:
        """A send between two experiments; a failure here is repeat's, reported when it concludes."""
        if self.failure is not None:
            return
        try:
            await self.tick()
        except (BudgetExhausted, CheckError) as e:
            self.failure = e

    async def conclude(self, sends: int, compare: dict | None, label: str) -> None:
        try:
            if self.failure is not None:
                raise self.failure
            for _ in range(sends):
                await self.tick()
        finally:
            self.finish()
        if compare:
            await self.against(compare, label)

    async def tick(self) -> None:
        self.samples.append(await self.session.send(self.request))
        if len(self.samples) == 1:
            self.session.keep_reference(NAME, self.request, self.samples[0])

    def finish(self) -> None:
        if len(self.samples) > 1:
            self.trace.groups.append(summarize(f"run to run ({len(self.samples)} sends)", self.samples[0],
                                               self.samples[1:], self.session.cfg.tolerance))

    async def against(self, report: dict, label: str) -> None:
        for ref in report["references"]:
            req = Request(ref["path"], ref["body"])
            now = await self.session.send(req)
            self.trace.groups.append(summarize(f"vs {label}: {ref['name']}", Sample.from_dict(ref["sample"]), [now],
                                               self.session.cfg.tolerance))
        before = sorted(report.get("endpoint", {}).get("system_fingerprints", {}))
        now_fps = sorted(self.session.client.fingerprints)
        if before != now_fps:
            self.trace.notes.append(f"system_fingerprint was {', '.join(before) or 'absent'}, now "
                                    f"{', '.join(now_fps) or 'absent'}")
