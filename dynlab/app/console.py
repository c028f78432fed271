"""The terminal side of the command line: a terminal that cannot print a character, and the
error line of an option that only other studies take.  Torch-free."""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any


def option_of_other_studies(exc: BaseException, args: list[str], command: Callable[[], Any]) -> str | None:
    """The error line of ``dynlab study NAME --opt`` where ``--opt`` is an option of other
    studies, not of NAME: which studies take it (the framework would suggest a look-alike
    option); None for any other error.  ``command``: the command line's Click command."""
    name = getattr(exc, "option_name", None)
    if type(exc).__name__ != "NoSuchOption" or len(args) < 2 or args[0] != "study" or not name:
        return None
    group = command().commands["study"]
    takers = [n for n, c in group.commands.items() if n != args[1] and any(name in p.opts for p in c.params)]
    if not takers or args[1] not in group.commands:
        return None
    return (f"error: study {args[1]} takes no {name}; allowed: {name} with {', '.join(takers)} "
            f"(`dynlab study {args[1]} --help`)")


def tolerant_output() -> None:
    """Let stdout and stderr print any text on a terminal whose encoding lacks a character
    (``PYTHONIOENCODING=ascii``, ``LANG=C`` on an old Python): written as an escape
    (``\\u2026``) instead of failing with ``UnicodeEncodeError``."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="backslashreplace")
            except (ValueError, OSError):  # a stream that cannot change now keeps its settings
                pass
