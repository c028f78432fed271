"""The first moments of the ``dynlab`` executable: Ctrl-C is exit code 130 and one line.

:func:`guard_start` replaces Python's SIGINT handler (which raises ``KeyboardInterrupt``,
a traceback while modules are still being imported) by :func:`interrupted_at_start`:
nothing is open or written yet, so it prints ``interrupted`` and exits with code 130 at
once.  ``dynlab/__init__.py`` calls it first thing when the process is the ``dynlab``
executable, ``cli.py`` when it runs as ``python -m dynlab.cli``; ``dynlab.cli.main`` hands
SIGINT back to Python (``KeyboardInterrupt``) once the command runs.  A program that
imports dynlab keeps its own SIGINT handling.

A Ctrl-C before dynlab's code runs (the interpreter's own start-up, its ``site`` module)
is the interpreter's to handle.  This module imports nothing beyond ``os``, ``signal`` and
``sys``.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["guard_start", "interrupted_at_start", "is_the_executable"]


def interrupted_at_start(signum, frame) -> None:  # noqa: ARG001 - a signal handler's signature
    """SIGINT while the command line starts: say ``interrupted``, exit with code 130."""
    try:
        os.write(2, b"interrupted\n")
    finally:
        os._exit(130)


def guard_start() -> None:
    """Install :func:`interrupted_at_start` unless a program set its own SIGINT handler
    (Python's default is replaced)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupted_at_start)


def is_the_executable() -> bool:
    """Whether this process is the ``dynlab`` executable (its console script)."""
    return os.path.basename(sys.argv[0] if sys.argv else "") in ("dynlab", "dynlab.exe")
