"""The one progress bar (loading, probing, checking): rich, on stderr. Shown on a terminal, and gone when done, unless
`show` says otherwise: False hides it (`--quiet`); True shows it wherever stderr goes, where no terminal redraws it
as one final line."""
from __future__ import annotations

from collections.abc import Iterable


def progress_bar(show: bool | None = None):
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

    console = Console(stderr=True)
    visible = console.is_terminal if show is None else show
    return Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                    console=console, transient=console.is_terminal, disable=not visible)


def untracked(items: Iterable, total: int | None = None) -> Iterable:
    """A loader's `track` when nothing counts: the items as they are."""
    return items
