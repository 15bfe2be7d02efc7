"""What every experiment shares: the session (requests built for the chosen API, bursts, references) and the
trace an experiment fills as it goes, so a budget that runs out mid-way still leaves what was measured."""
from __future__ import annotations

import asyncio
import random
from dataclasses import dataclass, field

from samebits.check.client import CheckError, Client, Reply
from samebits.check.compare import GroupStats
from samebits.check.config import CheckConfig
from samebits.check.constrained import constraint_fields
from samebits.check.sample import NoLogprobs, Sample, parse_chat, parse_completion

STATUSES = ("clean", "variant", "skipped", "incomplete", "error")


@dataclass(frozen=True)
class Request:
    path: str
    body: dict


@dataclass
class Trace:
    name: str
    groups: list[GroupStats] = field(default_factory=list)
    method: str | None = None
    skipped: str | None = None
    notes: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class Outcome:
    name: str
    status: str
    note: str
    method: str | None
    groups: tuple[GroupStats, ...]

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"status must be one of {STATUSES}, got {self.status!r}")

    def as_dict(self) -> dict:
        return {"name": self.name, "status": self.status, "note": self.note, "method": self.method,
                "groups": [g.as_dict() for g in self.groups]}


def outcome(trace: Trace, stopped: str | None = None, error: str | None = None) -> Outcome:
    """A variance found before the budget ran out is still a finding; only a clean partial run is incomplete."""
    notes = list(trace.notes)
    if any(g.variant for g in trace.groups):
        status = "variant"
    elif error is not None:
        status, notes = "error", [error, *notes]
    elif stopped is not None:
        status, notes = "incomplete", [stopped, *notes]
    elif trace.skipped is not None:
        status, notes = "skipped", [trace.skipped, *notes]
    else:
        status = "clean"
    return Outcome(trace.name, status, "; ".join(notes), trace.method, tuple(trace.groups))


class Session:
    def __init__(self, cfg: CheckConfig, client: Client, model: str):
        self.cfg = cfg
        self.client = client
        self.model = model
        self.rng = random.Random(cfg.seed)
        self.references: dict[str, tuple[Request, Sample]] = {}

    def request(self, prompt: str | list[int], *, temperature: float = 0.0, seed: int | None = None,
                max_tokens: int | None = None, **extra) -> Request:
        common = {"model": self.model, "max_tokens": max_tokens or self.cfg.max_tokens, "temperature": temperature,
                  **({} if seed is None else {"seed": seed}), **constraint_fields(self.cfg.constrained, prompt),
                  **extra}
        if self.cfg.api == "chat":
            return Request("/chat/completions", {"messages": [{"role": "user", "content": prompt}],
                                                 "logprobs": True, "top_logprobs": 1, **common})
        return Request("/completions", {"prompt": prompt, "logprobs": 1, **common})

    def parse(self, req: Request, reply: Reply) -> Sample:
        if reply.status != 200:
            raise CheckError(f"POST {req.path} answered HTTP {reply.status}: {reply.error_message}")
        try:
            return (parse_chat if req.path == "/chat/completions" else parse_completion)(reply.body)
        except NoLogprobs as e:
            raise CheckError(f"POST {req.path}: {e}") from None

    async def send(self, req: Request) -> Sample:
        return self.parse(req, await self.client.post(req.path, req.body))

    async def burst(self, reqs: list[Request]) -> list[Sample]:
        """All at once, so the server sees them in flight together."""
        tasks = [asyncio.ensure_future(self.client.post(r.path, r.body)) for r in reqs]
        try:
            replies = await asyncio.gather(*tasks)
        except BaseException:
            for t in tasks:  # a failed burst leaves nothing running behind the next experiment
                t.cancel()
            raise
        return [self.parse(r, reply) for r, reply in zip(reqs, replies)]

    def keep_reference(self, name: str, req: Request, sample: Sample) -> None:
        """Requests that a later run (`--compare`) replays and compares with this run's answers."""
        self.references.setdefault(name, (req, sample))
