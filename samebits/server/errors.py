"""OpenAI-shaped errors: `{"error": {"message", "type", "param", "code"}}` with the HTTP status that fits."""
from __future__ import annotations

import json

from starlette.responses import Response

from samebits.engine.async_engine import EngineDead, QueueFull
from samebits.errors import FieldError

# An echoed client value is cut to this many characters: a megabyte `model` must not come back in the 404.
ECHO_CHARS = 64
# Every message is cut to this: no error body grows with the request that caused it.
MESSAGE_CHARS = 1024
# Seconds a client told 429 (queue full) waits before retrying; a queue of waiting work drains in about that time.
RETRY_AFTER_S = 1


def clip(value, limit: int = ECHO_CHARS) -> str:
    text = str(value)
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


class APIError(Exception):
    """An error the client gets as OpenAI error JSON; `status` < 500 whenever the client is at fault."""

    def __init__(self, status: int, message: str, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        message = clip(message, MESSAGE_CHARS)
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", param, code)


def not_found(message: str, param: str | None = None, code: str = "not_found") -> APIError:
    return APIError(404, message, "invalid_request_error", param, code)


def unauthorized() -> APIError:
    return APIError(401, "Missing or incorrect API key: send `Authorization: Bearer <key>`.",
                    "invalid_request_error", None, "invalid_api_key")


def too_large(limit: int) -> APIError:
    return APIError(413, f"Request body exceeds the limit of {limit} bytes.", "invalid_request_error", None,
                    "request_too_large")


def queue_full(limit: int) -> APIError:
    # 429, not 503: the server is healthy, it only refuses more waiting work; the client may retry later. A request
    # that could never fit is a 400 instead (async_engine.RequestTooLarge).
    return APIError(429, f"The waiting queue is full (at most {limit} waiting sequences); retry later.",
                    "rate_limit_error", None, "queue_full", {"Retry-After": str(RETRY_AFTER_S)})


def engine_dead() -> APIError:
    return APIError(503, "The engine loop has stopped; this server cannot serve requests.", "server_error", None,
                    "engine_dead")


def internal_error() -> APIError:
    return APIError(500, "Internal server error.", "server_error", None, "internal_error")


def error_response(err: APIError, headers: dict | None = None) -> Response:
    return Response(json.dumps(err.body()), status_code=err.status, headers={**err.headers, **(headers or {})},
                    media_type="application/json")


def field_of(e: BaseException) -> str | None:
    """The field an error blames, as the error carries it (samebits/errors.py FieldError); None for any other."""
    return e.field if isinstance(e, FieldError) else None


def map_error(e: BaseException) -> APIError:
    """Engine-side exceptions -> what the client sees."""
    if isinstance(e, APIError):
        return e
    if isinstance(e, QueueFull):
        return queue_full(e.limit)
    if isinstance(e, EngineDead):
        return engine_dead()
    if isinstance(e, ValueError):
        return invalid(str(e), field_of(e))
    return APIError(500, f"internal error: {type(e).__name__}", "server_error", None, "internal_error")


def validation_message(error: dict) -> tuple[str, str | None]:
    """A pydantic error dict -> (message naming the field, param)."""
    loc = [str(p) for p in error.get("loc", ()) if p not in ("body",)]
    # Union members add their type name to the location; it tells the client nothing about its own field.
    loc = [p for p in loc if not _is_type_tag(p)]
    param = loc[0] if loc else None
    where = ".".join(loc) if loc else "body"
    return f"{where}: {error.get('msg', 'invalid value')}", param


def _is_type_tag(part: str) -> bool:
    return part in ("str", "int", "float", "list[str]", "list[int]", "list[list[int]]", "bool") or part.startswith(
        ("function-", "list[", "dict[", "literal[", "tagged-union", "union["))


def aborted() -> APIError:
    return APIError(503, "The request was aborted by the server before it finished.", "server_error", None, "aborted")
