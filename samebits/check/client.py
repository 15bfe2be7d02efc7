"""The only code that talks HTTP: bounded retries for 429/503, a request budget and a wall-clock deadline.

Every attempt, retried or not, counts against the budget, so a server that answers 429 forever ends the check
instead of keeping it alive.
"""
from __future__ import annotations

import asyncio
import json
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import httpx

RETRY_STATUS = frozenset({429, 503})
BACKOFF_BASE_S = 0.5
BACKOFF_CAP_S = 10.0
# Headers that describe the numerics of the endpoint (ours, and any *-fingerprint header another server sends);
# per-request values such as the seed or the request id are not the endpoint's and are left out.
NUMERICS_PREFIX = "x-samebits-"
PER_REQUEST = frozenset({"x-samebits-seed"})


class CheckError(Exception):
    """The endpoint cannot be tested; the message is the one line the user sees."""


class BudgetExhausted(Exception):
    """The request budget or the wall-time limit ran out; the experiment in progress stops where it is."""


@dataclass(frozen=True)
class Reply:
    status: int
    body: dict
    headers: dict[str, str]

    @property
    def error_message(self) -> str:
        err = self.body.get("error") if isinstance(self.body, dict) else None
        if isinstance(err, dict) and err.get("message"):
            return str(err["message"])
        return json.dumps(self.body)[:200]


def numerics_headers(headers: httpx.Headers) -> dict[str, str]:
    return {k: v for k, v in headers.items()
            if (k.startswith(NUMERICS_PREFIX) or k.endswith("fingerprint")) and k not in PER_REQUEST}


class Client:
    def __init__(self, base_url: str, api_key: str | None, *, max_requests: int, max_wall_s: float,
                 request_timeout_s: float, retries: int, max_connections: int,
                 on_request: Callable[[], None] = lambda: None):
        auth = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        limits = httpx.Limits(max_connections=max_connections, max_keepalive_connections=max_connections)
        self.http = httpx.AsyncClient(base_url=base_url, headers=auth, limits=limits, timeout=request_timeout_s)
        self.base_url = base_url
        self.max_requests = max_requests
        self.deadline = time.monotonic() + max_wall_s
        self.request_timeout_s = request_timeout_s
        self.retries = retries
        self.on_request = on_request
        self.sent = 0
        self.fingerprints: Counter[str] = Counter()
        self.headers: dict[str, Counter[str]] = {}

    async def aclose(self) -> None:
        await self.http.aclose()

    async def get(self, path: str) -> Reply:
        return await self._send("GET", path, None)

    async def post(self, path: str, body: dict) -> Reply:
        return await self._send("POST", path, body)

    async def _send(self, method: str, path: str, body: dict | None) -> Reply:
        for attempt in range(self.retries):
            reply = await self._attempt(method, path, body)
            if reply.status not in RETRY_STATUS:
                return reply
            await self._backoff(attempt, reply)
        return await self._attempt(method, path, body)

    async def _attempt(self, method: str, path: str, body: dict | None) -> Reply:
        remaining = self.deadline - time.monotonic()
        if self.sent >= self.max_requests:
            raise BudgetExhausted(f"the request budget ({self.max_requests}) is spent")
        if remaining <= 0:
            raise BudgetExhausted("the wall-time limit is reached")
        self.sent += 1
        try:
            r = await self.http.request(method, path, json=body, timeout=min(self.request_timeout_s, remaining))
        except httpx.TimeoutException:
            raise CheckError(f"{method} {self.base_url}{path} timed out after "
                             f"{min(self.request_timeout_s, remaining):.0f}s") from None
        except httpx.TransportError as e:
            raise CheckError(f"cannot reach {self.base_url}: {type(e).__name__}: {e or 'connection failed'}") from None
        finally:
            self.on_request()
        return self._record(r)

    def _record(self, r: httpx.Response) -> Reply:
        try:
            body = r.json()
        except ValueError:
            body = {"error": {"message": f"HTTP {r.status_code}, not JSON: {r.text[:120]!r}"}}
        if not isinstance(body, dict):
            body = {"error": {"message": f"HTTP {r.status_code}, a JSON {type(body).__name__}, not an object"}}
        if r.status_code == 200 and body.get("system_fingerprint"):
            self.fingerprints[str(body["system_fingerprint"])] += 1
        for k, v in numerics_headers(r.headers).items():
            self.headers.setdefault(k, Counter())[v] += 1
        return Reply(r.status_code, body, dict(r.headers))

    async def _backoff(self, attempt: int, reply: Reply) -> None:
        wait = min(BACKOFF_CAP_S, BACKOFF_BASE_S * 2**attempt)
        after = reply.headers.get("retry-after", "")
        if after.isdigit():
            wait = min(BACKOFF_CAP_S, float(after))
        if time.monotonic() + wait > self.deadline:
            raise BudgetExhausted("the wall-time limit would pass while backing off from HTTP "
                                  f"{reply.status}: {reply.error_message}")
        await asyncio.sleep(wait)
