"""The one error that names the request or config field at fault as data, torch-free and below every layer, so
the server's `param` (server/errors.py) is read from the error, not guessed from its message."""
from __future__ import annotations


class FieldError(ValueError):
    """A bad value of one field: `field` names it (an OpenAI error's `param`), the message says why and the limit."""

    def __init__(self, field: str, message: str):
        super().__init__(message)
        self.field = field

    def __reduce__(self):  # both arguments, so it crosses the engine process's pipe (engine/engine_process.py)
        return type(self), (self.field, str(self))


def require(ok: bool, field: str, message: str) -> None:
    """FieldError(field, message) unless `ok`: the one form of a config's or a request's check."""
    if not ok:
        raise FieldError(field, message)
