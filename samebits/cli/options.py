"""Typer options generated from config dataclasses: one flag per field, so a new field cannot lack its flag."""
from __future__ import annotations

import dataclasses
import functools
import inspect
import json
import typing

import typer
from typer.core import TyperCommand

from samebits.server.config import API_KEY_FLAG

# Flags not spelled as their field: a repeatable one is named for one value (`--api-key A --api-key B` fills
# `api_keys`); an output file's is its format's.
FLAG_NAMES = {"api_keys": API_KEY_FLAG, "json_path": "--json"}


def field_flags(config, help: dict[str, str], skip: tuple[str, ...] = (),
                groups: dict[str, str] | None = None) -> list[inspect.Parameter]:
    """One keyword parameter per field of the dataclass instance `config`, its value the flag's default; `groups`:
    the help section of each field's flag (GroupedHelpCommand)."""
    hints = typing.get_type_hints(type(config))
    return [flag(f.name, getattr(config, f.name), hints[f.name], help.get(f.name), (groups or {}).get(f.name))
            for f in dataclasses.fields(config) if f.name not in skip]


def flag(name: str, default, hint, help: str | None, group: str | None = None) -> inspect.Parameter:
    """One keyword parameter: a typer option named for `name` (or FLAG_NAMES[name])."""
    metavar = None
    if typing.get_origin(hint) is tuple and typing.get_args(hint)[-1] is Ellipsis:
        # typer's tuples have a fixed length (`--prompt-tokens 128 1024`); a repeated flag gives a list
        item = typing.get_args(hint)[0]
        hint, default, metavar = list[item], list(default), f"<{item.__name__}>..."
    if any(dataclasses.is_dataclass(arg) for arg in typing.get_args(hint)):
        # A nested config is given as JSON, which its field's validation parses (vLLM's --speculative-config)
        hint, default = str | None, None if default is None else json.dumps(dataclasses.asdict(default))
    decls = (FLAG_NAMES[name],) if name in FLAG_NAMES else ()
    option = typer.Option(default, *decls, help=help, show_default=default not in (None, []), metavar=metavar,
                          rich_help_panel=group)
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


def spread_values(args: list[str], flags: tuple[str, ...]) -> list[str]:
    """vLLM's several values after one flag (argparse's nargs="+": `--served-model-name a b`) as click's repeated
    flag (`--served-model-name a --served-model-name b`): the words after the flag's value, up to the next option."""
    out, flag, taken = [], None, 0
    for arg in args:
        if arg.startswith("-"):
            flag, taken = (arg, 0) if arg in flags else (None, 0)
        elif flag is not None:
            taken += 1
            if taken > 1:
                out.append(flag)
        out.append(arg)
    return out


class GroupedHelpCommand(TyperCommand):
    """A command of many flags (serve): help as plain text in sections, one per flag group, that click wraps to the
    terminal (at most 80 columns) and never cuts, where rich's one table cuts long flag names at 80 columns. Its
    MULTI_VALUE flags take several values, vLLM's way (spread_values)."""

    MULTI_VALUE = ("--served-model-name",)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.rich_markup_mode = None  # click's formatter (TyperCommand.format_help), not rich's table

    def parse_args(self, ctx, args: list[str]) -> list[str]:
        return super().parse_args(ctx, spread_values(args, self.MULTI_VALUE))

    def format_options(self, ctx, formatter) -> None:
        sections: dict[str, list[tuple[str, str]]] = {}
        for param in self.get_params(ctx):
            record = param.get_help_record(ctx)
            if record is not None:
                default = "Arguments" if param.param_type_name == "argument" else "Other"
                sections.setdefault(getattr(param, "rich_help_panel", None) or default, []).append(record)
        for name, rows in sections.items():
            with formatter.section(name):
                formatter.write_dl(rows)
