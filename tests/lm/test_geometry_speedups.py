"""The two shortcuts of the task-geometry analysis give the numbers of the long way:
the spectrum of a diagonal own-state Jacobian from its diagonal, and the probe fitted in
PCA coordinates."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynlab.analysis.fixed_points.finder import diagonal_spectrum, spectrum
from dynlab.lm.analysis.state_geometry import probe_accuracy
from dynlab.lm.analysis.recurrence import LMRecurrence, flat_states, layer_jacobian_diagonal, layer_jacobians
from dynlab.lm.models.model import RecurrentLM


@pytest.mark.parametrize("n, k", [(20, 3), (150, 4), (150, 0)])
def test_diagonal_spectrum_equals_the_dense_one(n, k):
    rng = np.random.default_rng(n + k)
    d = rng.uniform(-0.2, 1.0, n)
    d[:2] = 1.0  # two fixed directions
    basis = np.linalg.qr(rng.standard_normal((n, k)))[0] if k else np.zeros((n, 0))
    got, want = diagonal_spectrum(d, basis), spectrum(np.diag(d), basis)
    np.testing.assert_allclose(np.abs(got["eig"]), np.abs(want["eig"]), rtol=1e-10, atol=1e-12)
    for key in ("rho", "rho_perp") + (("rho_par",) if k else ()):
        np.testing.assert_allclose(got[key], want[key], rtol=1e-8, atol=1e-10, err_msg=key)
    assert got["fixed_dim"] == want["fixed_dim"] == 2 and got["stable"] == want["stable"]


@pytest.mark.parametrize("mixer", ["mamba2", "mamba1", "gla"])
def test_own_state_jacobian_is_diagonal_and_its_diagonal_is_found(mixer):
    torch.manual_seed(0)
    kw = {"mamba2": {"n_heads": 2, "head_dim": 4, "d_state": 4}, "mamba1": {"d_state": 4}, "gla": {"n_heads": 2}}[mixer]
    lm = RecurrentLM(mixer, d_model=16, n_layers=2, **kw).double().eval()
    rec = LMRecurrence(lm).double()
    h, x = flat_states(rec, torch.randint(0, 256, (3, 12)))
    dense = layer_jacobians(rec, h, x, -1)
    diag = layer_jacobian_diagonal(rec, h, x, -1)
    assert diag is not None
    for j, d in zip(dense, diag):
        np.testing.assert_allclose(np.diag(j), d, rtol=1e-10, atol=1e-12)
        np.testing.assert_allclose(j - np.diag(np.diag(j)), 0.0, rtol=0, atol=1e-12)


def test_a_coupled_step_is_not_taken_for_diagonal():
    torch.manual_seed(0)
    lm = RecurrentLM("mamba2", d_model=16, n_layers=1, n_heads=2, head_dim=4, d_state=4).double().eval()
    rec = LMRecurrence(lm).double()
    h, x = flat_states(rec, torch.randint(0, 256, (2, 6)))
    sl = rec.layer_slice(-1)
    mix = torch.randn(sl.stop - sl.start, sl.stop - sl.start, dtype=torch.float64) * 0.1
    step = rec.step

    def coupled(state, tokens):  # the layer's state mixed by a dense matrix: J is not diagonal
        logits, new = step(state, tokens)
        new = new.clone()
        new[:, sl] = new[:, sl] + state[:, sl] @ mix
        return logits, new

    rec.step = coupled
    assert layer_jacobian_diagonal(rec, h, x, -1) is None


def test_probe_in_pca_coordinates_scores_as_the_plain_probe():
    from sklearn.linear_model import LogisticRegression
    from sklearn.model_selection import StratifiedKFold, cross_val_score
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    rng = np.random.default_rng(1)
    labels = np.repeat(np.arange(4), 30)
    states = rng.standard_normal((120, 400)) + 0.8 * np.eye(4)[labels] @ rng.standard_normal((4, 400))
    plain = make_pipeline(StandardScaler(), LogisticRegression(max_iter=5000, tol=1e-10))
    want = cross_val_score(plain, states, labels, cv=StratifiedKFold(5, shuffle=True, random_state=0)).mean()
    assert probe_accuracy(states, labels) == pytest.approx(want, abs=1e-12, rel=0)
