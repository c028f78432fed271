"""Ctrl-C (SIGINT) to a running study: exit code 130 and one line on stderr."""

from __future__ import annotations

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
#: SIGINT while the executable imports the rest of dynlab (``dynlab.errors``) or the command
#: line (``typer``), what a Ctrl-C 0.03-0.15 s after launch meets.  A Ctrl-C before that, in
#: the interpreter's own start-up, is Python's to handle.
_SIGINT_DURING_START = r"""
import os, signal, sys
module, sys.argv = sys.argv[1], ["dynlab", *sys.argv[2:]]
assert module not in sys.modules

class SigintOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == module:
            os.kill(os.getpid(), signal.SIGINT)
        return None

sys.meta_path.insert(0, SigintOnImport())
from dynlab.cli import entry
entry()
"""


@pytest.mark.parametrize("module, argv", [("dynlab.errors", ["study", "list"]), ("typer", ["study", "list"]),
                                          ("typer", ["study", "group-tracking", "--help"])],
                         ids=["importing-dynlab", "importing-the-cli", "help"])
def test_sigint_during_start_up_exits_130_with_one_line(tmp_path, module, argv):
    proc = subprocess.run([sys.executable, "-c", _SIGINT_DURING_START, module, *argv], cwd=tmp_path,
                          capture_output=True, text=True, timeout=120, preexec_fn=_default_sigint)
    assert (proc.returncode, proc.stderr, proc.stdout) == (EXIT_INTERRUPTED, "interrupted\n", "")


def test_guard_start_replaces_pythons_handler_only(monkeypatch):
    """``guard_start`` replaces Python's default SIGINT handler by its own, which
    ``dynlab.cli`` hands back to Python once a command runs; a program's own handler stays."""
    installed: list = []
    monkeypatch.setattr(signal, "signal", lambda sig, handler: installed.append(handler))
    monkeypatch.setattr(signal, "getsignal", lambda sig: signal.default_int_handler)
    _start.guard_start()
    monkeypatch.setattr(signal, "getsignal", lambda sig: print)  # a program's own handler stays
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
    import dynlab.runner
    from dynlab.cli import main

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(dynlab.runner, "run_study", interrupted)
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
