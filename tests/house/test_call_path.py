"""How far a run's training is from the command line: the calls from ``dynlab study``'s
command to the run's training entry point, read from the live call stack of a real
command (its entry point replaced by one that records the stack and stops the study).

Each call on the path has its own job: the command (wiring), the options and folders
(dynlab.app), the study (specs, folder, lock, and the steps of the loop over its runs:
heal, hand the work items to the executor, store, analyse), the executor (where work
runs), the work item (device, threads, provenance), the study's run function, the
training.  A new layer shows here as a longer path."""

from __future__ import annotations

import inspect

import pytest

from dynlab.cli import main

#: Calls from the command's function to the training entry point, at most.
MAX_HOPS = 6


class _Reached(Exception):
    """Raised by the replaced entry point once it has recorded the stack."""


def _dynlab_path(frames: list[inspect.FrameInfo]) -> list[str]:
    """The dynlab functions on ``frames`` (innermost first), outermost first, from the
    command's function on; comprehension frames (a Python detail) left out."""
    names = [f"{f.frame.f_globals.get('__name__', '?')}.{f.function}" for f in reversed(frames)
             if str(f.frame.f_globals.get("__name__", "")).startswith("dynlab")
             and not f.function.startswith("<")]
    start = next(i for i, n in enumerate(names) if n == "dynlab.cli.command")
    return names[start:]


def _path_to(monkeypatch, module, name: str, argv: list[str]) -> list[str]:
    seen: list[list[str]] = []

    def entry(*args, **kwargs):
        seen.append(_dynlab_path(inspect.stack()[1:]) + [f"{module.__name__}.{name}"])
        raise _Reached

    monkeypatch.setattr(module, name, entry)
    main(argv)  # stops at the entry point: an internal error, exit code 1, nothing stored
    assert seen, f"{argv} never reached {module.__name__}.{name}"
    return seen[0]


@pytest.mark.parametrize("paper", ["tracking", "lm"])
def test_a_run_trains_within_a_few_calls_of_the_command_line(paper, tmp_path, monkeypatch):
    if paper == "tracking":
        import dynlab.tracking.run as where
        argv, name = ["study", "group-tracking", "--preset", "smoke", "--models", "tanh-rnn"], "train_ensemble"
    else:
        import dynlab.studies.length_generalization as where
        argv, name = ["study", "length-generalization", "--preset", "smoke"], "train_and_evaluate"
    path = _path_to(monkeypatch, where, name, [*argv, "--out", str(tmp_path), "--quiet"])
    hops = len(path) - 1
    assert hops <= MAX_HOPS, f"{hops} calls from the command to the training: " + " → ".join(path)
    assert path[1].startswith("dynlab.app."), path  # the command line only wires


def test_the_path_check_can_fail(tmp_path, monkeypatch):
    """One more layer between the command and the study (a dynlab function wrapping
    run_study) makes the path one call longer; a stack without the command's function is
    no path from the command line."""
    import dynlab.runner.driver as driver
    import dynlab.tracking.run as where

    argv = ["study", "group-tracking", "--preset", "smoke", "--models", "tanh-rnn", "--quiet"]
    plain = _path_to(monkeypatch, where, "train_ensemble", [*argv, "--out", str(tmp_path / "a")])
    layer: dict = {"__name__": "dynlab.app.layer"}
    exec("def wrap(real):\n    def run_study(*args, **kwargs):\n        return real(*args, **kwargs)\n"
         "    return run_study\n", layer)
    monkeypatch.setattr(driver, "run_study", layer["wrap"](driver.run_study))
    wrapped = _path_to(monkeypatch, where, "train_ensemble", [*argv, "--out", str(tmp_path / "b")])
    assert len(wrapped) == len(plain) + 1 and "dynlab.app.layer.run_study" in wrapped, (plain, wrapped)
    with pytest.raises(StopIteration):
        _dynlab_path(inspect.stack())
