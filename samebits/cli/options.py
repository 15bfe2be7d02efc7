"""Typer options generated from config dataclasses: one flag per field, so a new field cannot lack its flag."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import typing

import typer

from samebits.server.config import API_KEY_FLAG

# Flags not spelled as their field: a repeatable one is named for one value (`--api-key A --api-key B` fills
# `api_keys`); an output file's is its format's.
FLAG_NAMES = {"api_keys": API_KEY_FLAG, "json_path": "--json"}


def field_flags(config, help: dict[str, str], skip: tuple[str, ...] = ()) -> list[inspect.Parameter]:
    """One keyword parameter per field of the dataclass instance `config`, its value the flag's default."""
    hints = typing.get_type_hints(type(config))
    return [flag(f.name, getattr(config, f.name), hints[f.name], help.get(f.name))
            for f in dataclasses.fields(config) if f.name not in skip]


def flag(name: str, default, hint, help: str | None) -> inspect.Parameter:
    """One keyword parameter: a typer option named for `name` (or FLAG_NAMES[name])."""
    if typing.get_origin(hint) is tuple and typing.get_args(hint)[-1] is Ellipsis:
        # typer's tuples have a fixed length (`--prompt-tokens 128 1024`); a repeated flag gives a list
        hint, default = list[typing.get_args(hint)[0]], list(default)
    decls = (FLAG_NAMES[name],) if name in FLAG_NAMES else ()
    option = typer.Option(default, *decls, help=help, show_default=default is not None)
    return inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=option, annotation=hint)


# typer passes its context to a parameter of this type (to ask whether a flag was given or defaulted).
CONTEXT = inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)


def positional(name: str, metavar: str, help: str) -> inspect.Parameter:
    """An optional positional argument, first in the command's signature."""
    argument = typer.Argument(None, metavar=metavar, help=help, show_default=False)
    return inspect.Parameter(name, inspect.Parameter.POSITIONAL_OR_KEYWORD, default=argument,
                             annotation=str | None)


def with_flags(parameters: list[inspect.Parameter]):
    """Give `fn(values: dict)` a typer signature of `parameters`; typer calls it with every flag's value."""

    def decorate(fn):
        @functools.wraps(fn)
        def command(**values):
            return fn(values)

        del command.__wrapped__  # else inspect.signature reads fn's one-argument signature
        command.__signature__ = inspect.Signature(parameters)
        command.__annotations__ = {}
        return command

    return decorate
