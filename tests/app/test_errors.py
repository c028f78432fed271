"""Bad input is exit 2 and one line; anything else is a bug and says so."""

from __future__ import annotations

import errno

import pytest

from dynlab.cli import main
from dynlab.errors import DynlabInputError


def test_input_error_is_a_value_error():
    assert issubclass(DynlabInputError, ValueError)  # callers that catch ValueError keep working


def _fail_with(monkeypatch, exc: BaseException) -> None:
    """``exc`` raised where ``dynlab figures`` opens the study's dataset."""
    import dynlab.results.schema

    def open_dataset(path):
        raise exc

    monkeypatch.setattr(dynlab.results.schema, "open_dataset", open_dataset)


def test_bad_input_is_exit_2_and_one_line(monkeypatch, tmp_path, capsys):
    monkeypatch.delenv("DYNLAB_DEBUG", raising=False)
    _fail_with(monkeypatch, DynlabInputError("no study dataset at x; run `dynlab study NAME --out DIR` first\nmore"))
    assert main(["figures", str(tmp_path), "--out", str(tmp_path / "f")]) == 2
    assert capsys.readouterr().err == "error: no study dataset at x; run `dynlab study NAME --out DIR` first\n"
    assert not (tmp_path / "f").exists()


@pytest.mark.parametrize("exc", [OSError(errno.ENOSPC, "No space left on device"),
                                 ValueError("conflicting sizes for dimension 't'"), KeyError("q")],
                         ids=["full-disk", "xarray-internal", "key-error"])
def test_anything_else_is_a_bug_exit_1_with_a_hint(monkeypatch, tmp_path, capsys, exc):
    monkeypatch.delenv("DYNLAB_DEBUG", raising=False)
    _fail_with(monkeypatch, exc)
    code = main(["figures", str(tmp_path), "--out", str(tmp_path / "f")])
    err = capsys.readouterr().err
    assert code == 1
    assert err.startswith(f"internal error (a bug in dynlab, or the machine failed): {type(exc).__name__}: ")
    assert err.rstrip().endswith("(set DYNLAB_DEBUG=1 for the traceback)") and err.count("\n") == 1


def test_debug_1_shows_the_traceback_of_a_failure_only_and_0_means_off(monkeypatch, tmp_path, capsys):
    """DYNLAB_DEBUG=1: a failure (exit 1) propagates with its traceback, bad input stays
    one line and exit 2; DYNLAB_DEBUG=0 is off; any other value is refused at start-up."""
    argv = ["figures", str(tmp_path), "--out", str(tmp_path / "f")]
    monkeypatch.setenv("DYNLAB_DEBUG", "1")
    _fail_with(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    with pytest.raises(OSError, match="No space left"):
        main(argv)
    _fail_with(monkeypatch, DynlabInputError("bad"))
    assert main(argv) == 2 and capsys.readouterr().err == "error: bad\n"
    monkeypatch.setenv("DYNLAB_DEBUG", "0")
    _fail_with(monkeypatch, OSError(errno.ENOSPC, "No space left on device"))
    assert main(argv) == 1
    assert capsys.readouterr().err.startswith("internal error (a bug in dynlab, or the machine failed): OSError: ")
    monkeypatch.setenv("DYNLAB_DEBUG", "yes")
    assert main(argv) == 2
    assert capsys.readouterr().err == ("error: environment variable DYNLAB_DEBUG='yes' is not a setting dynlab knows; "
                                       "allowed: 0, 1 (or unset)\n")


def test_a_full_disk_during_a_study_is_one_line_exit_1_and_the_store_stays_intact(monkeypatch, tmp_path, capfd):
    """A study whose dataset cannot be written (ENOSPC from every write to dataset.nc):
    one line, exit 1, no crash and nothing of the netCDF library on stderr; the runs are
    stored intact and no temporary file is left."""
    import os
    from pathlib import Path

    import dynlab.results.files as files
    from dynlab.results import RunStore

    if not Path("/proc/self/fd").is_dir():
        pytest.skip("needs /proc to tell a file's fd")
    monkeypatch.delenv("DYNLAB_DEBUG", raising=False)
    write = os.write

    def full_disk(fd, data):
        if "dataset.nc" in os.readlink(f"/proc/self/fd/{fd}"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, data)

    monkeypatch.setattr(files.os, "write", full_disk)
    code = main(["study", "group-tracking", "--preset", "smoke", "--models", "tanh-rnn", "--groups", "C2",
                 "--out", str(tmp_path), "-q", "--no-analysis", "--device", "cpu"])
    err = capfd.readouterr().err
    assert code == 1 and err.count("\n") == 1, err
    assert "No space left on device" in err and "dataset.nc" in err
    root = tmp_path / "group-tracking"
    assert not (root / "dataset.nc").exists()
    assert [p.name for p in root.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".tmp-")] == []
    runs = list((root / "runs").iterdir())
    assert len(runs) == 1 and RunStore(root).inspect(runs[0].name) is None
