"""Connections: uvicorn's h11 protocol with a deadline on each request's headers and on its body, a write deadline,
and a cap on open connections, so a client that connects and stalls (slowloris), or that stops reading its response,
holds a socket for seconds, not forever.

The header deadline starts when the connection opens, or when the previous response ends, and is not moved by bytes
trickling in; the body deadline starts once the headers are in. The response itself has no deadline (a long
generation or stream is legitimate); uvicorn's keep-alive timeout closes idle connections between requests. But a
response the client does not read fills the connection's buffer (WRITE_BUFFER_BYTES past the kernel's), and once
it stays full for the write deadline the connection is cut: the app hears a disconnect and aborts the requests.

Past the cap, PROBE_SLOTS more connections are let in for the probes alone (/health, /ready, /metrics), each closed
after its one answer, so an orchestrator never takes a full server for a dead one; anything else asked on them, and
every connection past those, gets the 503.
"""
from __future__ import annotations

import json
import logging
import uuid
from collections.abc import Callable
from dataclasses import dataclass

from samebits.server.errors import RETRY_AFTER_S, APIError
from samebits.server.middleware import OPEN_PATHS

log = logging.getLogger("samebits.server")

_REFUSAL = json.dumps(APIError(503, "Too many open connections; retry later.", "server_error", None,
                               "too_many_connections").body()).encode()
_REFUSAL_HEADERS = [(b"content-type", b"application/json"), (b"connection", b"close"),
                    (b"retry-after", b"%d" % RETRY_AFTER_S)]
# Written before the client has sent anything: the answer it reads to its request, then the connection closes.
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\n" + b"".join(b"%s: %s\r\n" % h for h in _REFUSAL_HEADERS)
           + b"content-length: %d\r\n\r\n" % len(_REFUSAL)) + _REFUSAL

REFUSED_LINGER_S = 1.0
# Connections past max_connections that may still ask a probe: a scraper and a few orchestrator probes at once.
PROBE_SLOTS = 16
# A probe sends its request at once: a probe slot waits this long for its headers, not the whole header deadline.
PROBE_HEADER_TIMEOUT_S = 2.0
# Response bytes a connection holds in the server's own buffer before writing pauses (asyncio's default high-water
# mark, set explicitly): past it the app's send waits, so a client that reads nothing holds at most this much here.
WRITE_BUFFER_BYTES = 64 * 1024


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int
    write_timeout_s: float = 30.0
    on_write_timeout: Callable[[], None] | None = None  # the server's metric of connections cut


def probes_only(app):
    """The ASGI app a probe slot runs: the probes, answered and closed; 503 for the rest."""

    async def answer(scope, receive, send):
        if scope["type"] != "http" or scope["path"] not in OPEN_PATHS:
            await send({"type": "http.response.start", "status": 503, "headers": _REFUSAL_HEADERS})
            await send({"type": "http.response.body", "body": _REFUSAL})
            return

        async def closing(message):
            if message["type"] == "http.response.start":
                message["headers"] = [*message.get("headers", []), (b"connection", b"close")]
            await send(message)

        await app(scope, receive, closing)

    return answer


def guarded_protocol(limits: ConnectionLimits) -> type:
    """An h11 protocol class for uvicorn's `http` setting, enforcing `limits`."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    deadlines = {h11.IDLE: ("headers", limits.header_timeout_s), h11.SEND_BODY: ("body", limits.body_timeout_s)}
    probe_deadlines = {**deadlines, h11.IDLE: ("headers", min(limits.header_timeout_s, PROBE_HEADER_TIMEOUT_S))}

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            self._phase: str | None = None
            self._timer = self._write_timer = None
            super().connection_made(transport)
            transport.set_write_buffer_limits(high=WRITE_BUFFER_BYTES)
            open_now = len(self.connections)
            self._deadlines = deadlines
            if open_now > limits.max_connections and open_now <= limits.max_connections + PROBE_SLOTS:
                self.app, self._deadlines = probes_only(self.app), probe_deadlines
            self._refused = open_now > limits.max_connections + PROBE_SLOTS
            if self._refused:
                # Half-close, then close a moment later: closing at once with the client's request unread would
                # reset the connection and lose the 503 before the client reads it.
                transport.write(REFUSED)
                transport.write_eof()
                self._timer = self.loop.call_later(REFUSED_LINGER_S, transport.close)
                return
            self._follow()

        def data_received(self, data: bytes) -> None:
            if not self._refused:
                super().data_received(data)

        def connection_lost(self, exc) -> None:
            self._disarm()
            self._disarm_write()
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow()

        def send_400_response(self, msg: str) -> None:
            """h11's refusal of what it cannot parse (a malformed request, a header block past its incomplete-event
            limit), in the API's JSON instead of uvicorn's text/plain."""
            body = json.dumps(APIError(400, f"{msg.rstrip('.')}: malformed, or its header block too large.",
                                       code="invalid_http").body()).encode()
            headers = [(b"content-type", b"application/json"), (b"connection", b"close"),
                       (b"x-request-id", uuid.uuid4().hex.encode())]
            for event in (h11.Response(status_code=400, headers=headers, reason=b"Bad Request"), h11.Data(data=body),
                          h11.EndOfMessage()):
                self.transport.write(self.conn.send(event))
            self.transport.close()

        def pause_writing(self) -> None:
            super().pause_writing()
            if self._write_timer is None:
                self._arm_write(self.transport.get_write_buffer_size())

        def resume_writing(self) -> None:
            super().resume_writing()
            self._disarm_write()

        def _follow(self) -> None:
            """Arm the deadline of the phase the client is in; a phase keeps the deadline it started with."""
            phase, seconds = self._deadlines.get(self.conn.their_state, (None, None))
            if phase == self._phase or self.transport.is_closing():
                return
            self._disarm()
            self._phase = phase
            if phase is not None:
                self._timer = self.loop.call_later(seconds, self._expire, phase)

        def _disarm(self) -> None:
            if self._timer is not None:
                self._timer.cancel()
                self._timer = None

        def _expire(self, phase: str) -> None:
            self._timer = None
            log.debug("closing a connection from %s: its request %s took too long", self.client, phase)
            self.transport.close()  # connection_lost follows: an app reading the body hears a disconnect

        def _arm_write(self, buffered: int) -> None:
            self._write_timer = self.loop.call_later(limits.write_timeout_s, self._write_expired, buffered)

        def _disarm_write(self) -> None:
            if self._write_timer is not None:
                self._write_timer.cancel()
                self._write_timer = None

        def _write_expired(self, buffered: int) -> None:
            """Still paused a write deadline later: cut the connection unless the client read some of the buffer."""
            now = self.transport.get_write_buffer_size()
            if now < buffered:  # it reads, slowly: a slow reader is not cut
                self._arm_write(now)
                return
            self._write_timer = None
            log.info("cutting a connection from %s: it read nothing of its response for %.1f s (%d bytes waiting)",
                     self.client, limits.write_timeout_s, now)
            if limits.on_write_timeout is not None:
                limits.on_write_timeout()
            self.transport.abort()  # close() would wait to flush the buffer the client does not read

    return GuardedH11Protocol
