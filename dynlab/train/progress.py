"""Progress display for long work (rich bars on stderr), or silence."""

from __future__ import annotations

import sys
from contextlib import AbstractContextManager
from typing import Any

__all__ = ["NullProgress", "Progress", "make_progress"]


class NullProgress(AbstractContextManager):
    """A progress sink that shows nothing (tests, library use)."""

    def add(self, description: str, total: int | None) -> int:
        return 0

    def update(self, task: int, advance: int = 1, **fields: Any) -> None:
        return None

    def describe(self, task: int, description: str) -> None:
        return None

    def log(self, message: str) -> None:
        return None

    def remove(self, task: int) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


class Progress(NullProgress):
    """Rich progress bars on stderr: one bar per task (e.g. runs, steps of the current run)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self._console = Console(file=sys.stderr)
        self._p = RichProgress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=self._console,
            transient=False,
        )

    def __enter__(self) -> Progress:
        self._p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._p.stop()

    def add(self, description: str, total: int | None) -> int:
        return self._p.add_task(description, total=total, info="")

    def update(self, task: int, advance: int = 1, **fields: Any) -> None:
        info = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        self._p.update(task, advance=advance, info=info)

    def describe(self, task: int, description: str) -> None:
        self._p.update(task, description=description)

    def log(self, message: str) -> None:
        self._p.console.print(message)

    def remove(self, task: int) -> None:
        self._p.remove_task(task)


def make_progress(show: bool) -> NullProgress:
    return Progress() if show else NullProgress()
