"""Study ``nonlinearity``: its specs, bad input, and a tiny end-to-end run with table and panel."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import torch

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from dynlab.tracking.figures.ablation import mp_by_nonlinearity  # noqa: E402
from dynlab.tracking.models import Tracker  # noqa: E402
from dynlab.runner.driver import open_study, run_study  # noqa: E402
from dynlab.studies import get_study  # noqa: E402
from dynlab.studies.nonlinearity import NONLINEARITIES, STUDY, make_specs, table  # noqa: E402
from dynlab.runner.protocol import StudyOptions  # noqa: E402

TINY = {
    "model": {"hidden": 8},
    "train": {"steps": 4, "batch_size": 8, "warmup_steps": 1},
    "eval": {"lengths": (4, 10), "n_samples": 8, "batch_size": 8, "chunk": 8},
}


def test_registered_and_specs_cover_every_phi_on_c6_and_s3():
    assert get_study("nonlinearity") is STUDY
    specs = make_specs(StudyOptions(preset="quick"))
    got = sorted((s.model.nonlinearity, s.task.group) for s in specs)
    assert got == sorted((p, g) for p in ("tanh", "relu", "maxmin", "groupsort", "layernorm", "sphere")
                         for g in ("C6", "S3"))
    assert {s.model.arch for s in specs} == {"token-gated-rnn"} and {s.model.hidden for s in specs} == {64}
    assert len({s.spec_hash() for s in specs}) == 12
    paper = make_specs(StudyOptions(preset="paper"))
    assert len(paper) == 6 * 2 * 5 and {s.eval.lengths[-1] for s in paper} == {1000}


def test_selections_and_bad_input():
    specs = make_specs(StudyOptions(preset="quick", models=("state-gated-rnn",), seeds=(3, 4),
                                    extra={"groups": ("A4",), "nonlinearities": ["sphere", "relu"]}))
    assert [(s.model.arch, s.model.nonlinearity, s.task.group, s.seed) for s in specs] == [
        ("state-gated-rnn", "sphere", "A4", 3), ("state-gated-rnn", "sphere", "A4", 4),
        ("state-gated-rnn", "relu", "A4", 3), ("state-gated-rnn", "relu", "A4", 4),
    ]
    with pytest.raises(ValueError, match="unknown nonlinearity 'softsign'; allowed: tanh, relu"):
        make_specs(StudyOptions(extra={"nonlinearities": ["softsign"]}))
    with pytest.raises(ValueError, match="unknown model 'gru'"):
        make_specs(StudyOptions(models=("gru",)))


@pytest.mark.parametrize("phi", NONLINEARITIES)
def test_the_cell_applies_phi_after_the_affine_map(phi):
    """h_1 from h_0 = 0 is phi(B x + b): compare with an independent computation of each phi."""
    model = Tracker("tanh-rnn", 3, 3, hidden=8, nonlinearity=phi)
    cell = model.cells[0]
    x = torch.tensor([1])
    h0 = torch.zeros(1, 8)
    with torch.no_grad():
        _, h1 = model.step(model.init_state(1), x)
        pre = cell.B(model.embed(x)) if hasattr(model, "embed") else None
    if pre is None:
        pytest.skip("tracker has no separate embedding")
    z = pre[0].double().numpy()
    ref = {
        "tanh": np.tanh(z),
        "relu": np.maximum(z, 0),
        "maxmin": np.stack([np.maximum(z[0::2], z[1::2]), np.minimum(z[0::2], z[1::2])], -1).ravel(),
        "groupsort": -np.sort(-z.reshape(-1, 4), axis=1).ravel(),
        "layernorm": (z - z.mean()) / np.sqrt(z.var() + 1e-5),
        "sphere": z * np.sqrt(8) / np.linalg.norm(z),
    }[phi]
    assert torch.equal(model.init_state(1), h0)
    np.testing.assert_allclose(h1[0].double().numpy(), ref, rtol=1e-5, atol=1e-6)


def test_tiny_end_to_end_dataset_table_and_panel(tmp_path):
    options = StudyOptions(preset="smoke", extra={"groups": ("C6",), **TINY, "nonlinearities": ["tanh", "sphere"]})
    path = run_study(STUDY, options, out=tmp_path, device="cpu", analyze=False)
    ds = open_study(path)
    assert ds.attrs["study"] == "nonlinearity"
    from dynlab.results.vocabulary import check_dataset

    assert check_dataset(ds) == []  # every variable is in the one vocabulary, with its units
    assert list(ds["nonlinearity"].values) == ["tanh", "sphere"] and set(ds["group"].values) == {"C6"}
    assert ds["accuracy"].shape == (2, 2) and np.isfinite(ds["accuracy"].values).all()
    text = table(ds)
    assert text.splitlines()[0].startswith("| nonlinearity | group | runs | learned | mp median")
    # 4 training steps never reach the training length: both runs are not-learned, no mp median
    assert list(ds["status"].values) == ["not-learned", "not-learned"]
    for phi in ds["nonlinearity"].values:
        row = next(line for line in text.splitlines() if line.startswith(f"| {phi} | C6 |"))
        assert row == f"| {phi} | C6 | 1 | 0 | — | — | 0 | 0 | 0 | 1 | 0 |"
    ax = mp_by_nonlinearity(ds, Figure().add_subplot())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["tanh", "sphere"]
