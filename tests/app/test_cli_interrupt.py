"""Ctrl-C (SIGINT) to a running study: exit code 130 and one line on stderr."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from dynlab import _start
from dynlab.errors import EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED, DynlabInputError, exit_status


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)  # a child of a shell's background job starts with SIGINT ignored


@pytest.mark.slow
def test_sigint_to_a_running_study_exits_130_with_one_line(tmp_path):
    out = tmp_path / "out"
    argv = [sys.executable, "-m", "dynlab.cli", "study", "group-tracking", "--preset", "quick", "--device", "cpu", "-q",
            "--out", str(out)]  # minutes of training: it is still running when the signal comes
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)
    try:
        runs = out / "group-tracking" / "runs"  # made just before the first run trains
        deadline = time.monotonic() + 300
        while not runs.is_dir() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    # 130 from dynlab. -SIGINT is CPython ending itself by the signal when a KeyboardInterrupt
    # escapes during interpreter shutdown, which a shell reports as 130 too; entry() guards
    # against it (test below), so either code means Ctrl-C ended the run
    assert proc.returncode in (EXIT_INTERRUPTED, -signal.SIGINT) and EXIT_INTERRUPTED == 130, (proc.returncode, stderr)
    assert stderr.splitlines() == ["interrupted"] and stdout == ""


#: Ctrl-C after dynlab's own code started (``dynlab/__init__.py`` guards first thing): a
#: SIGINT while the executable imports the guard (``dynlab._start``) and ``signal`` (before
#: the guard is in place), the rest of dynlab (``dynlab.errors``) or the command line
#: (``typer``), what a Ctrl-C 0.03-0.15 s after launch meets.  A Ctrl-C before that, in
#: the interpreter's own start-up, is Python's to handle.
_SIGINT_DURING_START = r"""
import _signal, os, sys
module, sys.argv = sys.argv[1], ["dynlab", *sys.argv[2:]]
assert module not in sys.modules

class SigintOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            os.kill(os.getpid(), _signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintOnImport())
from dynlab.cli import entry
entry()
"""


@pytest.mark.parametrize("module, argv", [("dynlab._start", ["study", "list"]), ("signal", ["study", "list"]),
                                          ("dynlab.errors", ["study", "list"]), ("typer", ["study", "list"]),
                                          ("typer", ["study", "group-tracking", "--help"])],
                         ids=["importing-the-guard", "importing-signal", "importing-dynlab", "importing-the-cli", "help"])
def test_sigint_during_start_up_exits_130_with_one_line(tmp_path, module, argv):
    proc = subprocess.run([sys.executable, "-c", _SIGINT_DURING_START, module, *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, preexec_fn=_default_sigint)
    assert (proc.returncode, proc.stderr, proc.stdout) == (EXIT_INTERRUPTED, "interrupted\n", "")


#: The modules a child looks up (imports) while Python's own SIGINT handler is still in
#: place, from ``import dynlab`` on as the executable (argv[0] ``dynlab``).
_IMPORTS_BEFORE_THE_GUARD = r"""
import _signal, sys
sys.argv = ["dynlab", "study", "list"]
unguarded = []

class Watch:
    def find_spec(self, name, path=None, target=None):
        if _signal.getsignal(_signal.SIGINT) is _signal.default_int_handler:
            unguarded.append(name)
        return None

sys.meta_path.insert(0, Watch())
import dynlab.cli
print(",".join(unguarded))
"""


def test_dynlab_imports_only_the_guard_before_the_guard(tmp_path):
    """The guard is the first thing dynlab does: before it, only the guard's own module is
    imported (inside the ``try`` of ``dynlab/__init__.py``, whose Ctrl-C is
    tested above); anything more there would be time in which Ctrl-C is a traceback."""
    proc = subprocess.run([sys.executable, "-c", _IMPORTS_BEFORE_THE_GUARD], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, preexec_fn=_default_sigint)
    assert proc.returncode == 0, proc.stderr
    # _signal is the interpreter's, loaded before any .pth file runs; nothing else may come
    # (signal's import alone pulls in enum and a dozen more modules when no .pth has loaded them)
    assert [m for m in proc.stdout.strip().split(",") if m != "_signal"] == ["dynlab", "dynlab._start"]


#: ``dynlab study list`` as the executable runs it, with a SIGINT sent to itself at the
#: ``argv[1]``-th line or return event of ``dynlab.cli.main`` and ``dynlab.cli.entry``
#: (``sys.settrace``: the handler runs in the tracer, before that line), or none (-1):
#: every point where the command line hands SIGINT to Python and takes it back.
_SIGINT_AT_EVENT = r"""
import os, signal, sys
at, fd, sys.argv = int(sys.argv[1]), int(sys.argv[2]), ["dynlab", "study", "list"]
import dynlab.cli
codes, seen = {dynlab.cli.main.__code__, dynlab.cli.entry.__code__}, []

def local(frame, event, arg):
    if event in ("line", "return"):
        seen.append(event)
        if len(seen) == at + 1:
            os.kill(os.getpid(), signal.SIGINT)
    return local

sys.settrace(lambda frame, event, arg: local if frame.f_code in codes else None)
try:
    dynlab.cli.entry()
finally:
    sys.settrace(None)
    os.write(fd, str(len(seen)).encode())
"""


def _sigint_at_event(tmp_path, at: int) -> tuple[int, str, int]:
    """``(exit code, stderr, events seen)`` of :data:`_SIGINT_AT_EVENT` with a SIGINT at event ``at``."""
    read, write = os.pipe()
    try:
        proc = subprocess.Popen([sys.executable, "-c", _SIGINT_AT_EVENT, str(at), str(write)], cwd=tmp_path,
                                pass_fds=(write,), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                                preexec_fn=_default_sigint)
        os.close(write)
        write = -1
        _, stderr = proc.communicate(timeout=120)
        seen = os.read(read, 64)
    finally:
        os.close(read)
        if write >= 0:
            os.close(write)
    return proc.returncode, stderr, int(seen or 0)


def test_sigint_at_every_step_of_main_and_entry_exits_130_with_one_line(tmp_path):
    """From the guard on, a Ctrl-C at any point of ``main`` and ``entry`` (before the
    command, in it, as ``main`` hands SIGINT back, as it returns, as ``entry`` exits) is
    exit code 130 and the one line ``interrupted``: no ``KeyboardInterrupt`` escapes."""
    code, stderr, events = _sigint_at_event(tmp_path, -1)
    assert (code, stderr) == (0, "") and events > 10
    for at in range(events):
        code, stderr, _ = _sigint_at_event(tmp_path, at)
        assert (code, stderr) == (EXIT_INTERRUPTED, "interrupted\n"), (at, code, stderr)


#: ``dynlab study list`` as the executable runs it, with a SIGINT that comes while a
#: finalizer runs (an object collected in the command), where Python cannot raise it: then
#: the command returns at once (``argv[1]`` "returns"), or goes on for up to 20 s ("runs on").
_SIGINT_IN_A_FINALIZER = r"""
import os, signal, sys, time
then, sys.argv = sys.argv[1], ["dynlab", "study", "list"]
import dynlab
import dynlab.app.study as app_study

class SigintOnCollect:
    def __del__(self):
        os.kill(os.getpid(), signal.SIGINT)  # the handler runs here, inside the finalizer

real = app_study.study_table

def study_table():
    SigintOnCollect()  # collected at once
    for _ in range(400 if then == "runs on" else 0):
        time.sleep(0.05)
    return real()

app_study.study_table = study_table
from dynlab.cli import entry
entry()
"""


@pytest.mark.parametrize("then", ["returns", "runs on"])
def test_sigint_in_a_finalizer_is_not_lost(tmp_path, then):
    """Python prints a ``KeyboardInterrupt`` raised in a finalizer as an "Exception ignored"
    traceback and goes on; the command line takes it again: exit code 130 and one line, at
    once (a command that runs on is interrupted: the table is never written)."""
    proc = subprocess.run([sys.executable, "-c", _SIGINT_IN_A_FINALIZER, then], cwd=tmp_path, capture_output=True,
                          text=True, timeout=120, preexec_fn=_default_sigint)
    assert (proc.returncode, proc.stderr) == (EXIT_INTERRUPTED, "interrupted\n")
    assert proc.stdout == "" or then == "returns"


#: ``dynlab study list`` as the executable runs it; it writes a byte to fd ``argv[1]`` once
#: ``import dynlab`` has put the guard in place (what came before is the interpreter's).
_STUDY_LIST_READY = r"""
import os, sys
fd, sys.argv = int(sys.argv[1]), ["dynlab", "study", "list"]
import dynlab
os.write(fd, b"r")
os.close(fd)
from dynlab.cli import entry
entry()
"""


@pytest.mark.slow
def test_sigint_at_any_moment_of_dynlab_study_list_exits_130_without_a_traceback(tmp_path):
    """SIGINT 0-300 ms after dynlab's guard is in place (the rest of the start-up, the
    command, the exit): exit code 130 and the one line ``interrupted``; or, when the
    command had finished (its whole table written), the process ends as it was ending:
    done (0), or ended by the signal during the interpreter's own shut-down, after its
    handlers are gone (-SIGINT: nothing printed, a shell's 130)."""
    table = subprocess.run([sys.executable, "-m", "dynlab.cli", "study", "list"], cwd=tmp_path, capture_output=True,
                           text=True, timeout=120).stdout
    assert table.startswith("study")
    interrupted = 0
    for delay_ms in range(0, 300, 10):
        read, write = os.pipe()
        proc = subprocess.Popen([sys.executable, "-c", _STUDY_LIST_READY, str(write)], cwd=tmp_path, pass_fds=(write,),
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, preexec_fn=_default_sigint)
        os.close(write)
        ready = os.read(read, 1)
        os.close(read)
        assert ready == b"r"
        time.sleep(delay_ms / 1000)
        proc.send_signal(signal.SIGINT)
        stdout, stderr = proc.communicate(timeout=120)
        outcome = (delay_ms, proc.returncode, stderr, stdout[-200:])
        assert "Traceback" not in stderr, outcome
        if proc.returncode == EXIT_INTERRUPTED:
            assert stderr == "interrupted\n", outcome
            interrupted += 1
        else:
            assert proc.returncode in (0, -signal.SIGINT) and stderr == "" and stdout == table, outcome
    assert interrupted >= 5


def test_guard_start_replaces_pythons_handler_only(monkeypatch):
    """``guard_start`` replaces Python's default SIGINT handler by its own, which
    ``dynlab.cli`` hands back to Python once a command runs; a program's own handler stays."""
    installed: list = []
    monkeypatch.setattr(_start.signal, "signal", lambda sig, handler: installed.append(handler))
    monkeypatch.setattr(_start.signal, "getsignal", lambda sig: signal.default_int_handler)
    _start.guard_start()
    monkeypatch.setattr(_start.signal, "getsignal", lambda sig: print)  # a program's own handler stays
    _start.guard_start()
    assert installed == [_start.interrupted_at_start]


def test_the_executable_ignores_sigint_once_an_interrupt_ended_the_run(monkeypatch):
    """entry() exits with main()'s code; after an interrupt (130) a further SIGINT is ignored,
    after any other end it exits with 130 and one line (nothing is left to clean up)."""
    import dynlab.cli

    before = signal.getsignal(signal.SIGINT)
    try:
        for code, handler in ((0, dynlab.cli._interrupted_at_start), (130, signal.SIG_IGN)):
            monkeypatch.setattr(dynlab.cli, "main", lambda code=code: code)
            with pytest.raises(SystemExit) as info:
                dynlab.cli.entry()
            assert info.value.code == code and signal.getsignal(signal.SIGINT) == handler
    finally:
        signal.signal(signal.SIGINT, before)


@pytest.mark.parametrize("exc, code, line", [
    (KeyboardInterrupt(), 130, "interrupted"),
    (DynlabInputError("unknown model 'x'; allowed: a\nmore"), 2, "error: unknown model 'x'; allowed: a"),
    (OSError(28, "No space left on device"), 1, "internal error (a bug in dynlab, or the machine failed): OSError: "),
    (RuntimeError(""), 1, "internal error (a bug in dynlab, or the machine failed): RuntimeError: RuntimeError "),
    (BrokenPipeError(32, "Broken pipe"), 1, None),
])
def test_exit_status_is_the_one_mapping(exc, code, line):
    got, text = exit_status(exc)
    assert got == code and (text == line if line is None else text.startswith(line))
    assert (EXIT_BAD_INPUT, EXIT_FAILURE, EXIT_INTERRUPTED) == (2, 1, 130)


def test_an_unreachable_scheduler_is_the_users_machine_not_a_bug():
    """A Dask scheduler that does not answer is exit 1 (the machine or network failed),
    said as an error of the machine, not as "a bug in dynlab"."""
    from dynlab.errors import DynlabMachineError
    from dynlab.executors import SchedulerUnreachable

    exc = SchedulerUnreachable("cannot reach the Dask scheduler at 'tcp://10.0.0.9:8786' within 10 s (timed out); "
                               "is it running?")
    assert isinstance(exc, DynlabMachineError) and isinstance(exc, ConnectionError)
    assert exit_status(exc) == (EXIT_FAILURE, "error: cannot reach the Dask scheduler at 'tcp://10.0.0.9:8786' within "
                                              "10 s (timed out); is it running?")


def test_exit_status_of_a_validation_error_and_of_the_framework():
    import typer
    from pydantic import BaseModel, Field, ValidationError

    class Spec(BaseModel):
        n: int = Field(ge=1)

    with pytest.raises(ValidationError) as info:
        Spec(n=0)
    assert exit_status(info.value) == (2, "error: invalid Spec: n: Input should be greater than or equal to 1")
    assert exit_status(typer.Exit(0)) == (0, None) and exit_status(typer.Exit(3)) == (3, None)
    assert exit_status(typer.Abort())[0] == 130


def test_keyboard_interrupt_in_a_command_returns_130(monkeypatch, tmp_path, capsys):
    import dynlab.runner.driver
    from dynlab.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dynlab.runner.driver, "run_study", interrupted)
    argv = ["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2", "--preset", "smoke", "-q",
            "--device", "cpu", "--out", str(tmp_path / "out")]
    assert main(argv) == 130
    captured = capsys.readouterr()
    assert captured.err == "interrupted\n" and captured.out == ""
    monkeypatch.setenv("DYNLAB_DEBUG", "1")  # an interrupt is no bug: no traceback either way
    assert main(argv) == 130


def test_a_closed_output_pipe_ends_quietly(tmp_path):
    proc = subprocess.Popen([sys.executable, "-m", "dynlab.cli", "study", "list"], cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader went away (dynlab study list | head -0)
    assert proc.wait(timeout=120) == 1
    assert proc.stderr.read() == b""
    proc.stderr.close()


def test_a_ctrl_c_that_python_wrapped_in_a_runtime_error_is_an_interrupt():
    """Python turns a KeyboardInterrupt raised in a class's __set_name__ into a RuntimeError
    whose cause it is (what a Ctrl-C while pydantic builds its classes meets): exit 130."""
    class Hook:
        def __set_name__(self, owner, name):
            raise KeyboardInterrupt

    with pytest.raises(RuntimeError) as info:
        type("Owner", (), {"hook": Hook()})
    assert exit_status(info.value) == (EXIT_INTERRUPTED, "interrupted")
    assert exit_status(RuntimeError("other"))[0] == EXIT_FAILURE
