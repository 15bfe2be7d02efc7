"""Before any experiment: which model, does the key work, does the endpoint return logprobs at all.

Each failure is one sentence naming the cause, because a determinism check that cannot run must say why, not
report a clean endpoint.
"""
from __future__ import annotations

from samebits.check.client import CheckError, Client
from samebits.check.experiment import Session
from samebits.check.needle import needle_prompt

AUTH_STATUS = frozenset({401, 403})


def _key_error(status: int, message: str) -> CheckError:
    return CheckError(f"the endpoint refused the API key (HTTP {status}: {message}); pass the right --api-key")


async def models(client: Client) -> tuple[list[dict], str]:
    """The /models cards, or [] and why not (some endpoints have no /models; the probe request decides then)."""
    reply = await client.get("/models")
    if reply.status in AUTH_STATUS:
        raise _key_error(reply.status, reply.error_message)
    data = reply.body.get("data") if reply.status == 200 else None
    if not isinstance(data, list):
        return [], f"GET /models answered HTTP {reply.status}"
    return [m for m in data if isinstance(m, dict) and "id" in m], ""


def pick_model(cards: list[dict], asked: str | None, why: str) -> str:
    if asked:
        return asked
    if len(cards) == 1:
        return str(cards[0]["id"])
    if not cards:
        raise CheckError(f"pass --model: the endpoint lists no models ({why or 'an empty list'})")
    raise CheckError(f"pass --model: the endpoint serves several: {', '.join(str(c['id']) for c in cards)}")


async def probe(session: Session, cards: list[dict]) -> None:
    """One plain greedy request with logprobs: the request every experiment is built from."""
    req = session.request(needle_prompt(session))
    reply = await session.client.post(req.path, req.body)
    if reply.status in AUTH_STATUS:
        raise _key_error(reply.status, reply.error_message)
    if reply.status == 404:
        served = ", ".join(str(c["id"]) for c in cards) or "unknown"
        raise CheckError(f"the model {session.model!r} does not exist on {session.cfg.url} (HTTP 404: "
                         f"{reply.error_message}); it serves: {served}")
    if reply.status != 200:
        raise CheckError(f"a plain {session.cfg.api} request with logprobs was refused (HTTP {reply.status}: "
                         f"{reply.error_message})")
    try:
        session.parse(req, reply)
    except CheckError as e:  # on a 200 the only failure left is a reply without logprobs
        raise CheckError(f"the endpoint returns no logprobs ({e}); samebits check compares logprob values "
                         "and cannot test it") from None
