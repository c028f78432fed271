"""Small refusals and notices of issue 44's polish list: an empty list item, an empty path,
a dataset dynlab did not write, an option of another study, `-q` silencing transformers'
notices, matplotlib's layout notice kept out of the output."""

from __future__ import annotations

import logging

import numpy as np
import pytest
import xarray as xr

from dynlab.cli import main


@pytest.mark.parametrize("argv, line", [
    (["study", "group-tracking", "--models", "tanh-rnn,,mamba"],
     "error: --models 'tanh-rnn,,mamba' has an empty item; allowed: a comma list of one or more values, none empty"),
    (["study", "group-tracking", "--groups", "C2,"],
     "error: --groups 'C2,' has an empty item; allowed: a comma list of one or more values, none empty"),
    (["study", "group-tracking", "--models", ""],
     "error: --models got an empty list (''); allowed: a comma list of one or more values"),
    (["analyze", ""], "error: STUDY_DIR got an empty path (''); allowed: a study folder written by `dynlab study`"),
    (["figures", " "], "error: STUDY_DIR got an empty path (' '); allowed: a study folder written by `dynlab study`, "
                       "or its dataset.nc"),
    (["report", ""], "error: DATASETS got an empty path (''); allowed: study folders, dataset.nc files or benchmark "
                     ".json files"),
    (["study", "group-tracking", "--source", "x"],
     "error: study group-tracking takes no --source; allowed: --source with length-generalization, copying, passkey, "
     "babilong (`dynlab study group-tracking --help`)"),
])
def test_polish_refusals_are_one_line_naming_the_input(argv, line, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert main(argv) == 2
    assert capsys.readouterr().err == line + "\n"
    assert list(tmp_path.iterdir()) == []


def test_report_on_a_dataset_dynlab_did_not_write_says_so(tmp_path, capsys):
    path = tmp_path / "foreign.nc"
    xr.Dataset({"x": ("t", np.arange(3.0))}).to_netcdf(path, engine="netcdf4")
    assert main(["report", str(path)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"error: {path} is not a dataset a dynlab study wrote (it has no 'study' attribute)")
    assert "None" not in err and err.count("\n") == 1


def test_quiet_silences_transformers_notices(monkeypatch):
    from helpers.optional import need_transformers

    transformers = need_transformers()
    from dynlab.app.checks import quiet_libraries

    monkeypatch.delenv("TRANSFORMERS_VERBOSITY", raising=False)
    before = transformers.logging.get_verbosity()
    logger = transformers.logging.get_logger("transformers.models.mamba2.modeling_mamba2")
    shown: list[str] = []

    class Keep(logging.Handler):
        def emit(self, record):
            shown.append(record.getMessage())

    keep = Keep()
    logger.addHandler(keep)
    try:
        transformers.logging.set_verbosity_warning()
        logger.warning("The fast path is not available")
        assert shown == ["The fast path is not available"]
        quiet_libraries()
        assert transformers.logging.get_verbosity() == logging.ERROR
        logger.warning("The fast path is not available")
        assert shown == ["The fast path is not available"]  # the second notice was not shown
    finally:
        logger.removeHandler(keep)
        transformers.logging.set_verbosity(before)


def test_a_crowded_figure_is_written_without_matplotlibs_layout_notice(tmp_path):
    """pytest turns warnings into errors here: the notice would fail the test."""
    from matplotlib.figure import Figure

    from dynlab.figures import _save

    fig = Figure(figsize=(1.0, 0.6), layout="constrained")
    ax = fig.add_subplot()
    ax.set_title("a title far too long for a figure this small " * 2)
    ax.set_ylabel("y\n" * 8)
    written: list = []
    _save(fig, tmp_path / "crowded", written)
    assert [p.name for p in written] == ["crowded.png", "crowded.pdf"] and all(p.stat().st_size > 0 for p in written)
