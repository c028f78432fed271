"""Processes that probe the same new output folder at once (the ranks of a torchrun, two
studies started together) all find it writable: one's clean-up does not fail another."""

from __future__ import annotations

import threading

import pytest

from dynlab.app.folders import folder_problem
from dynlab.outputs import probe_folder


def _probe_together(folder, n: int, deep: bool) -> list[str | None]:
    start = threading.Barrier(n)
    answers: list[str | None] = [None] * n

    def probe(i: int) -> None:
        start.wait()
        answers[i] = probe_folder(folder, deep=deep)

    threads = [threading.Thread(target=probe, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def test_probes_of_one_new_folder_at_once_all_succeed_and_leave_no_file(tmp_path):
    failures = []
    for trial in range(60):
        root = tmp_path / f"t{trial}"
        answers = _probe_together(root / "post-train" / "runs", 6, deep=trial % 2 == 1)
        failures += [a for a in answers if a is not None]
        left = [p for p in root.rglob("*") if not p.is_dir()] if root.exists() else []
        assert left == []  # no probe file stays (a folder made under another's probe may, empty)
    assert failures == []


def test_a_folder_under_a_file_is_still_refused(tmp_path):
    (tmp_path / "f").write_text("x")
    assert "cannot be written" in probe_folder(tmp_path / "f" / "sub")


@pytest.mark.parametrize("look", [probe_folder, folder_problem], ids=["probe_folder", "folder_problem"])
def test_a_folder_removed_and_made_again_between_two_looks_is_still_a_folder(tmp_path, monkeypatch, look):
    """The interleaving that once failed a CI run: another probe removes the new folder just
    before this one looks at it and a third makes it again just after.  One look (a single
    ``stat``) sees a folder or nothing, never 'a thing that exists but is not a folder'."""
    import os

    folder = tmp_path / "out" / "runs"
    real_stat, real_lstat = os.stat, os.lstat
    fired = {"stat": False, "lstat": False}

    def stat(path, *args, **kwargs):
        if os.fspath(path) == str(folder) and not fired["stat"] and os.path.isdir(str(folder.parent)):
            fired["stat"] = True
            if real_lstat(folder):
                os.rmdir(folder)  # another probe's clean-up
        return real_stat(path, *args, **kwargs)

    def lstat(path, *args, **kwargs):
        if os.fspath(path) == str(folder) and fired["stat"] and not fired["lstat"]:
            fired["lstat"] = True
            os.mkdir(folder)  # a third probe makes it again
        return real_lstat(path, *args, **kwargs)

    monkeypatch.setattr(os, "stat", stat)
    monkeypatch.setattr(os, "lstat", lstat)
    if look is folder_problem:  # it only looks; the probe makes the folder
        folder.mkdir(parents=True)
    assert look(folder) is None
    assert fired == {"stat": True, "lstat": True}


def test_a_loop_of_links_is_not_a_folder_in_one_line(tmp_path):
    """One stat that fails other than 'missing' (ELOOP) says 'not a folder', never an OSError."""
    loop = tmp_path / "loop"
    loop.symlink_to(loop)
    assert probe_folder(loop) == "is not a folder"
    assert folder_problem(loop) == "is not a folder"
