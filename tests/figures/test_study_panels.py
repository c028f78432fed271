"""End to end: a real analysed group-tracking smoke study speaks the vocabulary, and every
panel its Study declares is drawn, none skipped."""

from __future__ import annotations

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import pytest  # noqa: E402

from dynlab.figures import write_figures  # noqa: E402
from dynlab.results.vocabulary import check_dataset  # noqa: E402
from dynlab.runner.driver import open_study, run_study  # noqa: E402
from dynlab.studies import get_study  # noqa: E402
from dynlab.runner.protocol import StudyOptions  # noqa: E402

#: The smoke preset, with a linear curriculum so that the 20 steps reach the training
#: length (status ok): the panels draw ok runs only.
SMOKE_OK = StudyOptions(preset="smoke", models=("tanh-rnn", "mamba"),
                        extra={"groups": ("C2", "S3"), "train": {"curriculum": {"mode": "linear", "ramp_fraction": 0.5}}})


@pytest.fixture(scope="module")
def analysed_smoke(tmp_path_factory):
    path = run_study(get_study("group-tracking"), SMOKE_OK, out=tmp_path_factory.mktemp("gt"), device="cpu")
    return open_study(path)


@pytest.mark.slow
def test_group_tracking_dataset_speaks_the_vocabulary(analysed_smoke):
    ds = analysed_smoke
    assert (ds["status"] == "ok").all(), ds["status"].values
    assert {"q", "T_cross", "return_map_eig_real", "lyapunov", "perturb_delta_norm", "corr_r"} <= set(ds.data_vars)
    assert ds["lyapunov"].dims == ("run", "k_lyap") and ds["perturb_delta_norm"].dims == ("run", "direction", "t_pert")
    assert check_dataset(ds) == []


@pytest.mark.slow
def test_every_declared_panel_of_the_analysed_smoke_study_is_drawn(analysed_smoke, tmp_path):
    ds = analysed_smoke
    study = get_study("group-tracking")
    names = set(study.panels(ds))
    assert {"accuracy_C2", "accuracy_S3", "q_curves", "tcross_mp", "return_map_eigs", "perturbation_recovery",
            "margin"} <= names
    figs = write_figures(ds, tmp_path, study.panels)
    assert figs.skipped == {}
    composites = {"group-tracking", "group-tracking-accuracy", "group-tracking-dynamics"}  # one per claim
    assert {p.name for p in figs.written} == {f"{n}.{e}" for n in names | composites for e in ("png", "pdf")}
    assert (tmp_path / "NOTES.txt").read_text() == "all panels drawn\n"
    plt.close("all")
