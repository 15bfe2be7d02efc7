"""One pure-ASGI middleware (no BaseHTTPMiddleware: it buffers streams and hides disconnects).

On every HTTP response: X-Request-Id, and the numerics headers once the request is authenticated (they name versions:
nothing for a client without the key). Before the app: header count/size limits, ambiguous framing, and the API key
check (constant-time; /health and /metrics stay open so probes and scrapers need no secret).
"""
from __future__ import annotations

import hmac
import logging
import re
import uuid

from samebits.server.errors import APIError, error_response, internal_error, unauthorized

log = logging.getLogger("samebits.server")

OPEN_PATHS = frozenset({"/health", "/ready", "/metrics"})
_REQUEST_ID = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")


def request_id_of(headers: list[tuple[bytes, bytes]]) -> str:
    """The client's X-Request-Id when it is a plain token (it is echoed into a header), else a new one."""
    for k, v in headers:
        if k.lower() == b"x-request-id":
            value = v.decode("latin-1")
            if _REQUEST_ID.match(value):
                return value
    return uuid.uuid4().hex


def bearer_token(headers: list[tuple[bytes, bytes]]) -> bytes | None:
    for k, v in headers:
        if k.lower() == b"authorization" and v[:7].lower() == b"bearer ":
            return v[7:].strip()
    return None


def key_matches(token: bytes | None, keys: tuple[bytes, ...]) -> bool:
    # Every key is compared (no early exit), each in constant time, so timing says nothing about which or how close.
    ok = False
    for key in keys:
        ok |= hmac.compare_digest(token or b"", key)
    return ok and token is not None


class GuardMiddleware:
    def __init__(self, app, numerics_headers: dict[str, str], api_keys: tuple[str, ...], max_header_count: int,
                 max_header_bytes: int, on_error=None):
        self.app = app
        # The server's live dict: a weights update (server/admin.py) rewrites it, so it is encoded again when changed.
        self.numerics = numerics_headers
        self._encoded: tuple[dict, list] = ({}, [])
        self.keys = tuple(k.encode("utf-8") for k in api_keys)
        self.max_count = max_header_count
        self.max_bytes = max_header_bytes
        self.on_error = on_error

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = scope["headers"]
        rid = request_id_of(headers)
        scope.setdefault("state", {})["request_id"] = rid
        authenticated = not self.keys or key_matches(bearer_token(headers), self.keys)
        started: list[bool] = []
        send = self._decorated(send, rid, authenticated, started)
        problem = self._check(scope, authenticated)
        if problem is not None:
            return await error_response(problem)(scope, receive, send)
        try:
            await self.app(scope, receive, send)
        except Exception:
            # What no route turned into an APIError: an OpenAI-shaped 500 with the request id, not Starlette's text.
            if started:
                raise
            log.exception("internal error on %s %s (request %s)", scope["method"], scope["path"], rid)
            await error_response(internal_error())(scope, receive, send)

    def _numerics(self) -> list[tuple[bytes, bytes]]:
        seen, encoded = self._encoded
        if seen != self.numerics:
            encoded = [(k.lower().encode("latin-1"), v.encode("latin-1")) for k, v in self.numerics.items()]
            self._encoded = (dict(self.numerics), encoded)
        return encoded

    def _decorated(self, send, rid: str, authenticated: bool, started: list[bool]):
        """`send` with the response's extra headers; `started` gets an entry when the response starts."""
        extra = (self._numerics() if authenticated else []) + [(b"x-request-id", rid.encode("latin-1"))]

        async def wrapped(message):
            if message["type"] == "http.response.start":
                started.append(True)
                message["headers"] = list(message.get("headers", [])) + extra
                if message["status"] >= 400 and self.on_error is not None:
                    self.on_error(message["status"])
            await send(message)

        return wrapped

    def _check(self, scope, authenticated: bool) -> APIError | None:
        headers = scope["headers"]
        if len(headers) > self.max_count:
            return APIError(431, f"Too many request headers: {len(headers)} > {self.max_count}.",
                            code="header_fields_too_large")
        size = sum(len(k) + len(v) for k, v in headers)
        if size > self.max_bytes:
            return APIError(431, f"Request headers too large: {size} bytes > {self.max_bytes}.",
                            code="header_fields_too_large")
        names = {k.lower() for k, _ in headers}
        if b"content-length" in names and b"transfer-encoding" in names:
            # Two framings of one body: a proxy in front may read the other one (request smuggling). The
            # connection closes, since where this body ends is exactly what is in doubt.
            return APIError(400, "Content-Length and Transfer-Encoding must not be sent together; send one.",
                            code="ambiguous_framing", headers={"Connection": "close"})
        if not authenticated and scope["path"] not in OPEN_PATHS:
            return unauthorized()
        return None
