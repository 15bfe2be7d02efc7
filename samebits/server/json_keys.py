"""Duplicate keys in a request body: JSON allows them, parsers keep one of the values (pydantic the last), so a client
sending `temperature` twice would get one of its two answers silently. The body is refused instead, naming the key."""
from __future__ import annotations

import json

from samebits.server.errors import APIError, clip, invalid


class _Duplicate(Exception):
    def __init__(self, key: str):
        self.key = key


def _unique(pairs: list[tuple[str, object]]) -> None:
    """json's object hook: raise on a key seen twice in one object. It builds nothing: only the check is wanted."""
    seen = set()
    for key, _ in pairs:
        if key in seen:
            raise _Duplicate(key)
        seen.add(key)


def duplicate_key_error(body: bytes) -> APIError | None:
    """The 400 for the first key an object of `body` holds twice, else None. A body that is not JSON passes: the
    request model's parse names what is wrong with it."""
    try:
        json.loads(body, object_pairs_hook=_unique)
    except _Duplicate as d:
        return invalid(f"The JSON body sends the key {clip(d.key)!r} twice in one object; send each key once.",
                       d.key, "duplicate_key")
    except (ValueError, RecursionError):
        return None
    return None
