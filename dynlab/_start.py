"""The first moments of the ``dynlab`` executable: Ctrl-C is exit code 130 and one line.

:func:`guard_start` replaces Python's SIGINT handler (which raises ``KeyboardInterrupt``,
a traceback while modules are still being imported) by :func:`interrupted_at_start`:
nothing is open or written yet, so it prints ``interrupted`` and exits with code 130 at
once.  ``dynlab/__init__.py`` calls it first thing when the process is the ``dynlab``
executable, ``cli.py`` when it runs as ``python -m dynlab.cli``.  While a command runs,
``dynlab.cli.main`` hands SIGINT back to Python (:func:`command_starts`: a
``KeyboardInterrupt``, which the command line turns into exit code 130) and takes it back
before it returns (:func:`command_ends`); ``dynlab.cli.entry`` catches a
``KeyboardInterrupt`` that comes as ``main`` returns; one that Python swallows (raised in
a finalizer, it prints a traceback and goes on) is taken again (:func:`command_starts`).
So from the guard on, no ``KeyboardInterrupt`` leaves dynlab's code or is lost.  A program
that imports dynlab keeps its own SIGINT handling.

Before its guard, dynlab imports only this module (it takes the signal functions from
``_signal``, which the interpreter loaded at start-up, not from ``signal``, whose import
builds enums: milliseconds in which Python's own handler still raises):
``dynlab/__init__.py`` imports it inside a ``try`` whose ``KeyboardInterrupt``, in the
executable, is the same one line and exit code 130.  A Ctrl-C before dynlab's code runs (the interpreter's own start-up,
its ``site`` module and the ``.pth`` files of the environment, the console script) is the
interpreter's to handle; one after the interpreter has begun to shut down (its handlers
gone) ends the process by the signal, which a shell reports as 130 too.  This module
imports nothing beyond ``os``, ``_signal`` and ``sys`` (and ``threading``, already loaded,
when a finalizer swallowed a Ctrl-C).
"""

# no ``from __future__ import annotations``: its module would be one more import before the guard;
# ``_signal``, the interpreter's own (loaded at start-up), not ``signal``, which imports enum first
import _signal as signal
import os
import sys

__all__ = ["command_ends", "command_starts", "guard_start", "interrupted_at_start", "is_the_executable", "raise_pending"]


def interrupted_at_start(signum, frame) -> None:  # noqa: ARG001 - a signal handler's signature
    """SIGINT while the command line starts (or ends): say ``interrupted``, exit with code 130."""
    try:
        os.write(2, b"interrupted\n")
    finally:
        os._exit(130)


def guard_start() -> None:
    """Install :func:`interrupted_at_start` unless a program set its own SIGINT handler
    (Python's default is replaced)."""
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:
        signal.signal(signal.SIGINT, interrupted_at_start)


#: The ``sys.unraisablehook`` that :func:`command_starts` replaced (restored by :func:`command_ends`).
_HOOKS: list = []
#: A ``KeyboardInterrupt`` that a finalizer swallowed, not yet taken again (one entry each).
_PENDING: list = []


def _interrupt_unraisable(unraisable) -> None:
    """``sys.unraisablehook`` while a command runs: a ``KeyboardInterrupt`` raised where
    Python cannot raise it (in a finalizer, a weakref callback, a generator closed when it
    is collected) is neither printed (a traceback) nor lost (the command would go on): it
    is taken again at the command's next step, by SIGINT sent from another thread
    :data:`REDELIVER_S` later (once this hook has returned: here it would be swallowed
    again), or by :func:`raise_pending` as the command returns, whichever comes first.
    Anything else goes to the hook before."""
    if not isinstance(unraisable.exc_value, KeyboardInterrupt):
        (_HOOKS[-1] if _HOOKS else sys.__unraisablehook__)(unraisable)
        return
    _PENDING.append(True)
    try:
        import threading

        threading.Thread(target=_redeliver, name="dynlab-sigint", daemon=True).start()
    except KeyboardInterrupt:  # another SIGINT while the thread started: raise_pending takes it
        _PENDING.append(True)
    except RuntimeError:  # no thread now: raise_pending takes it
        pass


#: Seconds after which a swallowed ``KeyboardInterrupt`` is sent again (:func:`_interrupt_unraisable`).
REDELIVER_S = 0.05


def _redeliver() -> None:
    """SIGINT again for a swallowed ``KeyboardInterrupt`` (:func:`_interrupt_unraisable`), unless taken already."""
    import time

    time.sleep(REDELIVER_S)
    try:
        _PENDING.pop()
    except IndexError:
        return
    os.kill(os.getpid(), signal.SIGINT)  # from this thread: Python's handler runs in the main thread, at its next step


def raise_pending() -> None:
    """Raise the ``KeyboardInterrupt`` that a finalizer swallowed while the command ran
    and that has not come again yet (``dynlab.cli.main``, as the command returns)."""
    try:
        _PENDING.pop()
    except IndexError:
        return
    raise KeyboardInterrupt


def command_starts() -> bool:
    """Hand SIGINT back to Python (a ``KeyboardInterrupt``) for the command, when
    :func:`guard_start` holds it; whether it did (then :func:`command_ends` takes it back).
    A ``KeyboardInterrupt`` that comes in a finalizer is taken again after it
    (:func:`_interrupt_unraisable`)."""
    if signal.getsignal(signal.SIGINT) is not interrupted_at_start:
        return False
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if sys.unraisablehook is not _interrupt_unraisable:
        _HOOKS.append(sys.unraisablehook)
        sys.unraisablehook = _interrupt_unraisable
    return True


def command_ends(code: int) -> None:
    """After the command, whose exit code is ``code``: SIGINT is ignored while a process
    that a Ctrl-C ended (130) exits, and exits at once with 130 otherwise (nothing is left
    to clean up)."""
    signal.signal(signal.SIGINT, signal.SIG_IGN if code == 130 else interrupted_at_start)
    if sys.unraisablehook is _interrupt_unraisable and _HOOKS:
        sys.unraisablehook = _HOOKS.pop()


def is_the_executable() -> bool:
    """Whether this process is the ``dynlab`` executable (its console script)."""
    return os.path.basename(sys.argv[0] if sys.argv else "") in ("dynlab", "dynlab.exe")
