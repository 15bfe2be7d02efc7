"""Connections: uvicorn's h11 protocol with a deadline on each request's headers and on its body, and a cap on open
connections, so a client that connects and stalls (slowloris) holds a socket for seconds, not forever.

The header deadline starts when the connection opens, or when the previous response ends, and is not moved by bytes
trickling in; the body deadline starts once the headers are in. The response itself has no deadline (a long
generation or stream is legitimate); uvicorn's keep-alive timeout closes idle connections between requests.
"""
from __future__ import annotations

import json
import logging
from dataclasses import dataclass

from samebits.server.errors import RETRY_AFTER_S, APIError

log = logging.getLogger("samebits.server")

_REFUSAL = json.dumps(APIError(503, "Too many open connections; retry later.", "server_error", None,
                               "too_many_connections").body()).encode()
# Written before the client has sent anything: the answer it reads to its request, then the connection closes.
REFUSED = (b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nconnection: close\r\n"
           b"retry-after: %d\r\ncontent-length: %d\r\n\r\n" % (RETRY_AFTER_S, len(_REFUSAL))) + _REFUSAL

REFUSED_LINGER_S = 1.0


@dataclass(frozen=True)
class ConnectionLimits:
    header_timeout_s: float
    body_timeout_s: float
    max_connections: int


def guarded_protocol(limits: ConnectionLimits) -> type:
    """An h11 protocol class for uvicorn's `http` setting, enforcing `limits`."""
    import h11
    from uvicorn.protocols.http.h11_impl import H11Protocol

    deadlines = {h11.IDLE: ("headers", limits.header_timeout_s), h11.SEND_BODY: ("body", limits.body_timeout_s)}

    class GuardedH11Protocol(H11Protocol):
        def connection_made(self, transport) -> None:
            self._phase: str | None = None
            self._timer = None
            super().connection_made(transport)
            self._refused = len(self.connections) > limits.max_connections
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
            super().connection_lost(exc)

        def handle_events(self) -> None:
            super().handle_events()
            self._follow()

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._follow()

        def _follow(self) -> None:
            """Arm the deadline of the phase the client is in; a phase keeps the deadline it started with."""
            phase, seconds = deadlines.get(self.conn.their_state, (None, None))
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

    return GuardedH11Protocol
