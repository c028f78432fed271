"""dynlab's error for bad input, and the exit code of every way a command can end.

:class:`DynlabInputError` marks a problem with what the user gave (an unknown model,
group, study or preset; an impossible length; a broken config, checkpoint or study
folder): the message is one line that names the value and the allowed values.  The
command line prints that line and exits with code 2, having written nothing.  Any other
exception is a bug in dynlab (or a failing machine: a full disk), and the command line
says so (``DYNLAB_DEBUG=1`` shows the traceback).

It subclasses :class:`ValueError`, so code that catches ``ValueError`` (and pydantic
validators, which turn a ``ValueError`` into a validation error) keeps working.

:func:`exit_status` is the one mapping from how a command ended to its exit code and the
one line it prints on stderr:

- :data:`EXIT_BAD_INPUT` (2): :class:`DynlabInputError`, a spec that fails validation
  (pydantic ``ValidationError``), a usage error (unknown command or option, a value of
  the wrong type);
- :data:`EXIT_INTERRUPTED` (130, as shells report SIGINT): ``KeyboardInterrupt``
  (Ctrl-C, or SIGINT sent to the process);
- :data:`EXIT_FAILURE` (1): :class:`DynlabMachineError`, a problem of the user's machine
  or network that dynlab recognised (a Dask scheduler that does not answer), said as
  ``error: …``; :class:`DynlabStoppedError`, bad input found only after the command had
  changed files (exit code 2 promises that nothing was written:
  :func:`stopping_after_changes`); anything else, a bug or a failing machine; also a
  closed output pipe (``dynlab … | head``), which prints nothing.

The ``DYNLAB_*`` environment switches (:data:`ENV_SWITCHES`) are checked by
:func:`check_environment` when a command starts: a value that is not one of the allowed
ones is bad input (exit 2), refused before any work.

This module imports nothing heavy: the command line refuses bad input without loading
torch.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

__all__ = ["ENV_OTHERS", "ENV_SWITCHES", "EXIT_BAD_INPUT", "EXIT_FAILURE", "EXIT_INTERRUPTED", "EXIT_OK", "DynlabInputError",
           "DynlabMachineError", "DynlabStoppedError", "check_environment", "debug_enabled", "exit_status",
           "format_validation_error", "in_option_words", "is_usage_error", "stopping_after_changes", "unknown_environment",
           "validation_errors"]

#: The command did what it was asked.
EXIT_OK = 0
#: A bug in dynlab, or the machine failed (a full disk, out of memory).
EXIT_FAILURE = 1
#: Bad input: nothing was written.
EXIT_BAD_INPUT = 2
#: Interrupted (SIGINT, Ctrl-C): 128 + the signal's number, as a shell reports it.
EXIT_INTERRUPTED = 130


class DynlabInputError(ValueError):
    """Bad input from the user: one line naming the value and what is allowed."""


class DynlabMachineError(RuntimeError):
    """A problem of the user's machine or network, not of dynlab and not of the input
    (a Dask scheduler that does not answer): one line saying what failed (exit code 1)."""


class DynlabStoppedError(DynlabMachineError):
    """A command stopped on bad input found only after it had changed files (a damaged run
    moved to quarantine, analyses rewritten): no longer "nothing written", so one line
    ``error: …`` saying what had changed, exit code 1."""


@contextmanager
def stopping_after_changes(changed: str, happened: Callable[[], bool] = lambda: True) -> Iterator[None]:
    """Around the part of a command that changes files: bad input found there
    (:class:`DynlabInputError`, a pydantic validation error), when ``happened()`` says that
    files had changed by then, is raised as :class:`DynlabStoppedError`, its line followed
    by ``changed`` (what the command had begun to change, and the way out)."""
    try:
        yield
    except Exception as exc:
        pydantic = sys.modules.get("pydantic")
        bad_input = isinstance(exc, DynlabInputError) or (pydantic is not None and isinstance(exc, pydantic.ValidationError))
        if bad_input and happened():
            line = first_line(exc) if isinstance(exc, DynlabInputError) else exit_status(exc)[1].removeprefix("error: ")
            raise DynlabStoppedError(f"{line}; {changed}") from exc
        raise


#: The environment switches dynlab reads and the values each allows (unset or empty: the
#: first, the default). ``DYNLAB_DEBUG=1`` shows the traceback of an error of exit code 1;
#: ``DYNLAB_KERNEL_BACKEND`` forces a scan backend (``dynlab.kernels.dispatch``);
#: ``DYNLAB_C_KERNELS=0`` turns the compiled C loops off (``dynlab.kernels.compiled``);
#: ``DYNLAB_KEEP_FREED_MEMORY=0`` leaves glibc's memory settings alone (``dynlab.runtime``).
ENV_SWITCHES: dict[str, tuple[str, ...]] = {
    "DYNLAB_DEBUG": ("0", "1"),
    "DYNLAB_KERNEL_BACKEND": ("auto", "torch", "triton", "mamba_ssm", "fla", "causal_conv1d"),
    "DYNLAB_C_KERNELS": ("1", "0"),
    "DYNLAB_KEEP_FREED_MEMORY": ("1", "0"),
}


#: ``DYNLAB_*`` names that are not switches of a command: the test suite's and the
#: benchmarks' (:func:`unknown_environment` does not warn of them).
ENV_OTHERS = ("DYNLAB_MAMBA_REF", "DYNLAB_REQUIRE_MAMBA_REF", "DYNLAB_REQUIRE_TRANSFORMERS", "DYNLAB_BENCH_REPORT")


def check_environment(environ: Mapping[str, str] | None = None) -> None:
    """Refuse a ``DYNLAB_*`` switch of :data:`ENV_SWITCHES` set to a value it does not
    allow (one line naming the variable and the allowed values)."""
    env = os.environ if environ is None else environ
    for name, allowed in ENV_SWITCHES.items():
        value = env.get(name, "")
        if value and value not in allowed:
            raise DynlabInputError(f"environment variable {name}={value!r} is not a setting dynlab knows; "
                                   f"allowed: {', '.join(allowed)} (or unset)")


def unknown_environment(environ: Mapping[str, str] | None = None) -> str | None:
    """One ``warning:`` line naming the ``DYNLAB_*`` variables that are set but that dynlab
    does not know (a typo such as ``DYNLAB_C_KERNEL`` is otherwise ignored in silence), and
    the switches it knows; None when there is none."""
    env = os.environ if environ is None else environ
    unknown = sorted(k for k in env if k.startswith("DYNLAB_") and k not in ENV_SWITCHES and k not in ENV_OTHERS)
    if not unknown:
        return None
    return (f"warning: dynlab does not know the environment variable{'s' if len(unknown) > 1 else ''} "
            f"{', '.join(unknown)} (ignored); its switches: {', '.join(ENV_SWITCHES)}")


def debug_enabled(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``DYNLAB_DEBUG=1`` asks for tracebacks (``0``, empty or unset: no)."""
    return (os.environ if environ is None else environ).get("DYNLAB_DEBUG", "") == "1"


def exit_status(exc: BaseException) -> tuple[int, str | None]:
    """The exit code of a command that raised ``exc`` and the one line to print on
    stderr (None: print nothing, e.g. after ``--help``).

    Bad input -> ``(2, "error: …")``; ``KeyboardInterrupt`` -> ``(130, "interrupted")``;
    :class:`DynlabMachineError` -> ``(1, "error: …")``;
    a click ``Exit`` (``--help``, an explicit exit) -> its own code and no line; a closed
    output pipe -> ``(1, None)``; anything else -> ``(1, "internal error (a bug in dynlab,
    or the machine failed): …")``.
    """
    if isinstance(exc, KeyboardInterrupt) or isinstance(exc.__cause__, KeyboardInterrupt):
        # Python wraps a Ctrl-C raised inside some hooks (a class's __set_name__) in a RuntimeError
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, BrokenPipeError):  # the reader of the output went away (dynlab … | head)
        return EXIT_FAILURE, None
    if isinstance(exc, DynlabInputError):
        return EXIT_BAD_INPUT, f"error: {first_line(exc)}"
    if isinstance(exc, DynlabMachineError):
        return EXIT_FAILURE, f"error: {first_line(exc)}"
    pydantic = sys.modules.get("pydantic")  # an exception of a library not loaded cannot be this one
    if pydantic is not None and isinstance(exc, pydantic.ValidationError):
        return EXIT_BAD_INPUT, f"error: invalid {exc.title}: {format_validation_error(exc)}"
    exits, aborts, usage = _framework_exceptions()
    if isinstance(exc, exits):
        return int(getattr(exc, "exit_code", 0) or 0), None
    if isinstance(exc, aborts):
        return EXIT_INTERRUPTED, "interrupted"
    if isinstance(exc, usage):  # unknown command or option, a value of the wrong type
        message = exc.format_message() if hasattr(exc, "format_message") else str(exc)
        return EXIT_BAD_INPUT, f"error: {first_line_of(message) or type(exc).__name__}"
    return EXIT_FAILURE, (f"internal error (a bug in dynlab, or the machine failed): {type(exc).__name__}: "
                          f"{first_line(exc)} (set DYNLAB_DEBUG=1 for the traceback)")


def _framework_exceptions() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """The command-line framework's exit, abort and usage-error classes among the loaded
    modules: typer's (which may vendor click) and click's."""
    exits: list[type] = []
    aborts: list[type] = []
    usage: list[type] = []
    typer = sys.modules.get("typer")
    if typer is not None:
        exits += [c for c in (getattr(typer, "Exit", None),) if c is not None]
        aborts += [c for c in (getattr(typer, "Abort", None),) if c is not None]
        usage += [c for c in (getattr(typer, "TyperException", None),) if c is not None]
    click = sys.modules.get("click.exceptions")
    if click is not None:
        exits.append(click.Exit)
        aborts.append(click.Abort)
        usage.append(click.ClickException)
    return tuple(exits), tuple(aborts), tuple(usage)


def is_usage_error(exc: BaseException) -> bool:
    """Whether ``exc`` is the command-line framework's own (a usage error, an exit, an
    abort), which ``DYNLAB_DEBUG=1`` does not turn into a traceback."""
    return isinstance(exc, tuple(c for group in _framework_exceptions() for c in group))


def first_line(exc: BaseException) -> str:
    """The first line of ``exc``'s message (its type's name when the message is empty)."""
    return first_line_of(str(exc)) or type(exc).__name__


def first_line_of(text: str) -> str:
    text = text.strip()
    return text.splitlines()[0] if text else ""


def validation_errors(exc: Any) -> list[tuple[list[str], str, dict[str, Any]]]:
    """The errors of a pydantic ``ValidationError``: ``(loc, message, error)`` for each, the
    location as strings and the message without pydantic's ``Value error, `` prefix.  Every
    way dynlab says a validation error (:func:`format_validation_error`, a study's options,
    the command line's options) reads them here."""
    return [([str(x) for x in err["loc"]], str(err["msg"]).removeprefix("Value error, "), err) for err in exc.errors()]


def format_validation_error(exc: Any) -> str:
    """A pydantic ``ValidationError`` as one line naming each bad field and why
    (``loc: message; …``; ``spec`` where the error is about the whole model)."""
    return "; ".join(f"{'.'.join(loc) or 'spec'}: {msg}" for loc, msg, _ in validation_errors(exc))


@contextmanager
def in_option_words(fields: Mapping[str, str]) -> Iterator[None]:
    """Say a spec's validation error in the words of the options: a bad field named in
    ``fields`` is reported as that option (``chunk_len`` -> ``--seq-len``), one line; a
    refusal whose line starts with such a field (``source 'x': …``) names the option
    (``--source 'x': …``)."""
    from pydantic import ValidationError

    try:
        yield
    except ValidationError as exc:
        parts: list[str] = []
        for loc, msg, err in validation_errors(exc):
            field = next((x for x in loc if x in fields), None)
            said = next((f for f in fields if msg.startswith((f"{f} ", f"{f}:")) and fields[f].startswith("--")), None)
            if field is None and said is not None:  # the spec as a whole, about a field an option sets
                part = fields[said] + msg[len(said):]
            elif field is None:  # a field no option sets, or the spec as a whole
                part = f"invalid {exc.title}: {'.'.join(loc) + ': ' if loc else ''}{msg}"
            elif "input" in err and not isinstance(err["input"], (dict, list, tuple)):
                part = f"{fields[field]} {err['input']!r}: {msg}"
            else:
                part = f"{fields[field]}: {msg}"
            if part not in parts:
                parts.append(part)
        raise DynlabInputError("; ".join(parts)) from None
    except DynlabInputError as exc:  # a refusal that names a field (``source 'x': …``): named as its option
        text = str(exc)
        field = next((f for f in fields if text.startswith(f"{f} ") and fields[f].startswith("--")), None)
        if field is None:
            raise
        raise DynlabInputError(fields[field] + text[len(field):]) from None
