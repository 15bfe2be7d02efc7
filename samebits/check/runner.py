"""`run(url, ...)`: the whole check as one call returning its exit code (0 clean, 1 variant, 2 could not test).

Nothing here raises for bad input: a wrong flag, an unreachable URL, a refused key, a missing model or an endpoint
without logprobs each become one line on stderr and exit code 2.
"""
from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

from rich.console import Console

from samebits.check import needle, prefill, prefix, repeat, report, sampled
from samebits.check.client import BudgetExhausted, CheckError, Client
from samebits.check.config import CheckConfig
from samebits.check.experiment import Outcome, Session, Trace, outcome
from samebits.check.html import write_html
from samebits.check.preflight import models, pick_model, probe
from samebits.jsonfile import check_writable, write_json
from samebits.progress import progress_bar

MODULES = {m.NAME: m for m in (needle, sampled, prefix, prefill)}
PREFLIGHT_REQUESTS = 2
TABLE_WIDTH = 160


def planned(cfg: CheckConfig, compare: dict | None) -> int:
    others = [e for e in cfg.experiments if e != repeat.NAME]
    total = PREFLIGHT_REQUESTS + sum(MODULES[e].planned(cfg) for e in others)
    if repeat.NAME in cfg.experiments:
        total += repeat.sends(len(others)) + len(compare["references"] if compare else [])
    return total


async def _guarded(trace: Trace, step) -> Outcome:
    try:
        await step()
    except BudgetExhausted as e:
        return outcome(trace, stopped=f"stopped: {e}")
    except CheckError as e:
        return outcome(trace, error=str(e))
    return outcome(trace)


async def _experiments(session: Session, compare: dict | None, compare_label: str) -> list[Outcome]:
    cfg = session.cfg
    others = [e for e in cfg.experiments if e != repeat.NAME]
    rep = repeat.Repeat(session, Trace(repeat.NAME)) if repeat.NAME in cfg.experiments else None
    outcomes = []
    for name in others:
        if rep:
            await rep.tick_between()
        trace = Trace(name)
        outcomes.append(await _guarded(trace, lambda n=name, t=trace: MODULES[n].run(session, t)))
    if rep:
        rest = repeat.sends(len(others)) - len(others)
        outcomes.append(await _guarded(rep.trace, lambda: rep.conclude(rest, compare, compare_label)))
    return outcomes


def _endpoint(client: Client, cards: list[dict], model: str) -> dict:
    card = next((c for c in cards if c.get("id") == model), {})
    return {"system_fingerprints": dict(client.fingerprints),
            "headers": {k: dict(v) for k, v in sorted(client.headers.items())},
            "max_model_len": card.get("max_model_len")}


async def _check(cfg: CheckConfig, compare: dict | None, compare_label: str | None, quiet: bool) -> dict:
    start = time.monotonic()
    with progress_bar(False if quiet else None) as bar:
        task = bar.add_task("preflight", total=planned(cfg, compare))
        client = Client(cfg.base_url, cfg.api_key, max_requests=cfg.max_requests, max_wall_s=cfg.max_wall_s,
                        request_timeout_s=cfg.request_timeout_s, retries=cfg.retries,
                        max_connections=max(cfg.concurrency) + 4, on_request=lambda: bar.advance(task))
        try:
            return await _session(cfg, client, compare, compare_label, bar, task, start)
        finally:
            await client.aclose()


async def _session(cfg, client, compare, compare_label, bar, task, start) -> dict:
    try:
        cards, why = await models(client)
        session = Session(cfg, client, pick_model(cards, cfg.model, why))
        await probe(session, cards)
    except BudgetExhausted as e:
        raise CheckError(f"preflight could not finish: {e}") from None
    need = planned(cfg, compare)
    if need > cfg.max_requests:
        raise CheckError(f"the selected experiments need {need} requests, more than --max-requests "
                         f"{cfg.max_requests}; lower --concurrency/--trials or raise the limit")
    bar.update(task, description="checking")
    outcomes = await _experiments(session, compare, compare_label or "")
    return report.build(cfg, session.model, _endpoint(client, cards, session.model), outcomes, session.references,
                        client.sent, time.monotonic() - start, compare_label)


def _fail(message: str) -> int:
    Console(stderr=True, highlight=False, soft_wrap=True).print(f"samebits check: error: {message}", markup=False)
    return report.EXIT["could not test"]


def run(url: str, *, json_path: str | Path | None = None, html_path: str | Path | None = None,
        compare: str | Path | None = None, quiet: bool = False, **options) -> int:
    """Check the endpoint at `url`; `options` are CheckConfig fields (model, api_key, api, experiments,
    concurrency, trials, max_tokens, tolerance, seed, max_requests, max_wall_s, ...). Returns the exit code."""
    try:
        cfg = CheckConfig(url, **options)
        json_path, html_path = (Path(p) if p is not None else None for p in (json_path, html_path))
        for p in (json_path, html_path):
            check_writable(p)
        old = report.load(Path(compare)) if compare is not None else None
        if old is not None and repeat.NAME not in cfg.experiments:
            raise ValueError("--compare replays references in the repeat experiment; select it too")
    except (TypeError, ValueError) as e:
        return _fail(str(e))
    try:
        result = asyncio.run(_check(cfg, old, str(compare) if compare is not None else None, quiet))
    except CheckError as e:
        return _fail(str(e))
    # The table fits 80 columns; in CI logs (no terminal) a wider console keeps its title and notes on one line each.
    Console(width=None if sys.stdout.isatty() else TABLE_WIDTH).print(report.table(result))
    if json_path:
        write_json(result, json_path)
    if html_path:
        write_html(result, html_path)
    return result["exit_code"]
