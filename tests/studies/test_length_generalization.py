"""Study length-generalization end to end (tiny overrides), its specs, dataset and figure panels."""

from __future__ import annotations

import json

import matplotlib
import numpy as np
import pytest

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402  (backend chosen first)

from dynlab.lm.figures.panels import effrem_panel, ppl_panel, state_std_panel  # noqa: E402
from dynlab.lm.spec import LMRunSpec  # noqa: E402
from dynlab.runner.driver import open_study, run_study  # noqa: E402
from dynlab.studies import get_study  # noqa: E402
from dynlab.studies.length_generalization import STUDY, make_specs  # noqa: E402
from dynlab.runner.protocol import StudyOptions  # noqa: E402

TINY = {
    "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
    "train": {"steps": 3, "batch_size": 2, "seq_len": 16},
    "eval": {"length_multiple": 16, "n_samples": 3, "chunk_len": 16, "bin_width": 8, "effrem_points": 4,
             "effrem_samples": 2},
}


def test_registered_and_quick_preset_specs():
    assert get_study("length-generalization") is STUDY
    specs = make_specs(StudyOptions(preset="quick"))
    assert [s.intervention.kind for s in specs] == ["zero", "random-noise", "fitted-noise", "state-passing", "tbtt"]
    assert all(s.model.mixer == "mamba2" and s.eval_length >= 16 * s.train.seq_len for s in specs)
    assert len({s.spec_hash() for s in specs}) == 5
    other = make_specs(StudyOptions(preset="quick", models=("gla", "mamba1"), extra={"interventions": ["zero"]}))
    assert [s.model.mixer for s in other] == ["gla", "mamba1"]


@pytest.mark.parametrize("options, match", [
    (StudyOptions(preset="quick", models=("lstm",)), "unknown mixer 'lstm'"),
    (StudyOptions(preset="quick", extra={"interventions": ["dropout"]}), "unknown intervention"),
    (StudyOptions(preset="quick", extra={"groups": ["S3"]}), "unknown option 'groups'"),
    (StudyOptions(preset="huge"), "unknown preset"),
    (StudyOptions(preset="quick", extra={"source": "/no/such/file.txt"}), "neither one of"),
])
def test_bad_selections_raise_one_line(options, match):
    with pytest.raises(ValueError, match=match):
        make_specs(options)


def test_spec_refuses_unknown_fields():
    with pytest.raises(ValueError):
        LMRunSpec.model_validate({"model": {"mixer": "mamba2", "width": 3}})


@pytest.mark.slow
def test_tiny_study_end_to_end_dataset_resume_and_panels(tmp_path):
    options = StudyOptions(preset="quick", extra=TINY)
    path = run_study(STUDY, options, out=tmp_path, device="cpu")
    ds = open_study(path)
    assert list(ds["intervention"].values) == ["zero", "random-noise", "fitted-noise", "state-passing", "tbtt"]
    # each quantity on its own positions, none padded: ppl at every t, the others at their grids
    assert ds["ppl"].dims == ("run", "t") and ds["effrem"].dims == ("run", "t_effrem")
    assert ds["ppl_binned"].dims == ("run", "t_bin") and ds["state_std"].dims == ("run", "layer", "head", "t_state")
    assert ds["t"].values.tolist() == list(range(1, 16 * 16 + 1))
    assert ds["t_bin"].values.tolist() == list(range(8, 257, 8)) and ds["t_bin_start"].values.tolist() == list(range(1, 250, 8))
    for name in ("ppl", "ppl_binned", "effrem", "state_std"):
        assert np.isfinite(ds[name]).all(), name
    # the loss curve: at most 64 points per run, the mean over windows of steps, ending at the last step
    assert ds["train_loss_curve"].dims == ("run", "loss_point") and ds["train_step"].dims == ("run", "loss_point")
    assert (ds["train_step"].isel(loss_point=-1) == 3).all() and ds["converged"].dtype == bool
    assert "levelled off" in ds["converged"].attrs["rule"] and ds.attrs["Conventions"] == "CF-1.11"
    for name in ("ppl", "ppl_binned", "effrem", "effrem_js", "effrem_cos", "state_mean", "state_std", "state_norm",
                 "lg_passed", "lg_worst_violation"):
        assert ds[name].attrs["long_name"] and "units" in ds[name].attrs, name
    assert (ds["effrem"].sel(t_effrem=0) == 0).all()
    from dynlab.figures import write_figures
    from dynlab.results.vocabulary import check_dataset

    assert check_dataset(ds) == []  # every variable is in the one vocabulary, with its units
    figs = write_figures(ds, tmp_path / "figs", STUDY.panels)
    assert figs.skipped == {} and len(figs.written) == 2 * 5  # ppl, effrem, state_std, training loss and the composite
    assert np.isfinite(ds["ppl"].sel(t=slice(1, None))).all()
    # the stored per-position PPL reproduces the binned value of the first bin: exp(mean log PPL(t) over the bin)
    first = ds["ppl"].sel(t=slice(1, 8))
    np.testing.assert_allclose(np.exp(np.log(first).mean("t")), ds["ppl_binned"].sel(t_bin=8), rtol=1e-10, atol=0)
    manifest = json.loads((path.parent / "manifest.json").read_text())
    assert len(manifest["run_ids"]) == 5
    before = {p.name: p.stat().st_mtime_ns for p in (path.parent / "runs").iterdir()}
    run_study(STUDY, options, out=tmp_path, device="cpu")  # resume: nothing retrained
    assert {p.name: p.stat().st_mtime_ns for p in (path.parent / "runs").iterdir()} == before
    fig, axes = plt.subplots(1, 3)
    for panel, ax in zip((ppl_panel, effrem_panel, state_std_panel), axes):
        assert panel(ds, ax) is ax
        assert len(ax.get_lines()) >= 5 and ax.get_ylabel()
    plt.close(fig)


def test_effrem_starts_cover_zero_and_recent_context():
    from dynlab.lm.run.text import effrem_starts

    t = effrem_starts(512, 10)
    assert t[0] == 0 and t[-1] == 511 and np.all(np.diff(t) > 0)
    kept = 512 - t
    assert {1, 512} <= set(kept.tolist()) and len(t) >= 9


@pytest.mark.parametrize("mixer", ["mamba1", "gla"])
def test_other_mixers_train_and_evaluate(mixer):
    from dynlab.lm.run.text import train_and_evaluate

    spec = make_specs(StudyOptions(preset="quick", models=(mixer,), extra={**TINY, "interventions": ["state-passing"]}))[0]
    result, weights = train_and_evaluate(spec, "cpu")
    assert result["status"] == "ok" and weights is not None
    assert len(result["ppl"]) == 16 * 16 and np.isfinite(result["ppl"]).all()
    assert result["effrem"]["tv"][0] == 0.0
