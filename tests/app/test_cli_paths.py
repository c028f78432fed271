"""Every path a command takes is read in one place (:func:`dynlab.app.checks.nonempty_path`)
before any work: ``~user`` of a user this machine does not have, and a name that is not
valid UTF-8, are one line naming the option (exit 2, nothing written); ``~`` is expanded
once, so a command writes where it checked."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dynlab.cli import main

#: A user no machine has.
NOBODY = "~dynlabnosuchuser7f3a"

#: Each command that takes a path: its argv (``{path}`` the path under test, ``{tmp}`` the
#: test's folder), and the option the line names.
PATH_OPTIONS = [
    (["study", "group-tracking", "--preset", "smoke", "--out", "{path}"], "--out"),
    (["study", "copying", "--preset", "smoke", "--out", "{path}"], "--out"),
    (["study", "copying", "--preset", "smoke", "--config", "{path}", "--out", "{tmp}/out"], "--config"),
    (["study", "passkey", "--preset", "smoke", "--source", "{path}", "--out", "{tmp}/out"], "--source"),
    (["study", "length-generalization", "--preset", "smoke", "--tokenizer", "{path}", "--out", "{tmp}/out"],
     "--tokenizer"),
    (["study", "length-generalization", "--preset", "pretrained", "--checkpoint", "{path}", "--out", "{tmp}/out"],
     "--checkpoint"),
    (["analyze", "{path}"], "STUDY_DIR"),
    (["figures", "{path}", "--out", "{tmp}/figs"], "STUDY_DIR"),
    (["figures", "{tmp}", "--out", "{path}"], "--out"),
    (["report", "{path}"], "DATASETS"),
    (["lm", "export", "{path}", "{tmp}/hf"], "RUN"),
    (["lm", "export", "{tmp}", "{path}"], "OUT"),
    (["lm", "post-train", "--checkpoint", "{path}", "--out", "{tmp}/out"], "--checkpoint"),
    (["lm", "post-train", "--checkpoint", "{tmp}", "--out", "{path}"], "--out"),
    (["lm", "post-train", "--checkpoint", "{tmp}", "--source", "{path}", "--out", "{tmp}/out"], "--source"),
    (["lm", "post-train", "--checkpoint", "{tmp}", "--tokenizer", "{path}", "--out", "{tmp}/out"], "--tokenizer"),
    (["data", "prepare", "{path}", "--out", "{tmp}/tokens"], "SOURCE"),
    (["data", "prepare", "{tmp}", "--out", "{path}"], "--out"),
    (["data", "prepare", "{tmp}", "--tokenizer", "{path}", "--out", "{tmp}/tokens"], "--tokenizer"),
    (["bench", "train", "--quick", "--json", "{path}"], "--json"),
    (["bench", "lm", "--json", "{path}"], "--json"),
]
IDS = [" ".join(a[:2]) + " " + opt for a, opt in PATH_OPTIONS]


def _argv(argv: list[str], path: str, tmp: Path) -> list[str]:
    return [a.replace("{path}", path).replace("{tmp}", str(tmp)) for a in argv]


def _tree(folder: Path) -> list[str]:
    return sorted(str(p.relative_to(folder)) for p in folder.rglob("*"))


@pytest.mark.parametrize("argv, option", PATH_OPTIONS, ids=IDS)
def test_a_path_of_an_unknown_user_is_bad_input_naming_the_option(argv, option, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    before = _tree(tmp_path)
    assert main(_argv(argv, f"{NOBODY}/x", tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"error: {option} '{NOBODY}/x': this machine has no user "), err
    assert _tree(tmp_path) == before  # nothing written, not even a folder named '~…'


@pytest.mark.parametrize("argv, option", PATH_OPTIONS, ids=IDS)
def test_a_path_that_is_not_utf8_is_refused_before_any_work(argv, option, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    bad = os.fsdecode(os.fsencode(str(tmp_path)) + b"/x\xff")  # a name of another encoding, as the shell passes it
    before = _tree(tmp_path)
    assert main(_argv(argv, bad, tmp_path)) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0] == (f"error: {option} '{tmp_path}/x\\xff' is not valid UTF-8; allowed: "
                                        f"{err[0].split('; allowed: ', 1)[1]}"), err
    assert err[0].endswith(", named in UTF-8")
    assert _tree(tmp_path) == before  # no lock, marker or run left by a study refused only after training


def test_a_study_writes_where_it_checked_its_quoted_home_out(tmp_path, capsys, monkeypatch):
    """``--out '~/x'`` (quoted: the shell left the ~) is the home folder's x, where the
    checks looked, not a folder named ``~`` in the current folder."""
    home, here = tmp_path / "home", tmp_path / "here"
    home.mkdir()
    here.mkdir()
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.chdir(here)
    argv = ["study", "group-tracking", "--preset", "smoke", "--models", "tanh-rnn", "--groups", "C2", "--seeds", "0",
            "--no-analysis", "-q", "--device", "cpu", "--out", "~/x"]
    assert main(argv) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip() == f"dataset: {home / 'x' / 'group-tracking' / 'dataset.nc'}"
    assert list(here.iterdir()) == []
