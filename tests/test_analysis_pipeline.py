"""The per-run analysis pipeline on trackers whose answers are known in advance."""

import numpy as np
import pytest
import torch

from dynlab.analysis import AnalysisSpec, analyze_tracker
from dynlab.groups import get_group
from dynlab.models import Tracker
from dynlab.tasks import WordProblem

from conftest import exact_tracker

SPEC = AnalysisSpec(n_samples=64, perturb_samples=32, perturb_steps=20, lyap_samples=4, lyap_steps=20, n_words=3)


def test_exact_affine_tracker_is_robust_and_neutral():
    task = WordProblem(get_group("S3"))
    ds = analyze_tracker(exact_tracker("S3"), task, SPEC, horizon=150, t_ref=20)
    # states are exactly the one-hot vertices: no scatter at all
    assert float(ds.R.max()) < 1e-12 and float(ds.q.max()) < 1e-12
    np.testing.assert_allclose(ds.M.values, np.sqrt(2.0), rtol=1e-12)
    assert str(ds.failure_mode.values) == "robust" and np.isnan(float(ds.T_cross))
    # identity readout on one-hot vertices: its margin is the nearest-centroid one, τ = 1/2
    np.testing.assert_allclose(ds.tau_readout.values, 0.5, rtol=1e-12)
    assert np.isnan(float(ds.T_cross_readout))
    # Theorem 1: the return map of a state-preserving word is the identity on U
    eig = ds.return_map_eig_real.values + 1j * ds.return_map_eig_imag.values
    np.testing.assert_allclose(eig, 1.0, atol=1e-10)
    assert int(ds.k_U_ref) == 5
    # permutations are orthogonal: perturbations neither grow nor decay, exponents are 0
    np.testing.assert_allclose(ds.recovery_rate.values, 0.0, atol=1e-10)
    np.testing.assert_allclose(ds.lyapunov.values, 0.0, atol=1e-10)


def test_contracting_tracker_return_map_below_one():
    """h ← λ P(x) h + (1 − λ) snap(P(x) h), snap = one-hot of the nearest vertex.

    The vertices are fixed points and snap is locally constant, so J = λ P(x): on U
    every state-preserving word of length L contracts by exactly λ^L, and a small
    perturbation decays at log λ per step.
    """
    lam = 0.8
    m = exact_tracker("C6")
    cell = m.cells[0]
    permute = cell.transition

    def transition(h, p):
        ph = permute(h, p)
        snap = (ph == ph.amax(-1, keepdim=True)).to(ph.dtype).detach()
        return lam * ph + (1 - lam) * snap

    cell.transition = transition  # type: ignore[method-assign]
    ds = analyze_tracker(m, WordProblem(get_group("C6")), SPEC, horizon=60, t_ref=10)
    eig = ds.return_map_eig_real.values + 1j * ds.return_map_eig_imag.values
    np.testing.assert_allclose(np.abs(eig), lam**SPEC.word_length, rtol=1e-9)
    np.testing.assert_allclose(ds.recovery_rate.values, np.log(lam), rtol=1e-6)
    np.testing.assert_allclose(ds.lyapunov.values, np.log(lam), rtol=1e-6)
    assert str(ds.failure_mode.values) == "robust"


def test_trained_like_random_tracker_produces_complete_dataset():
    torch.manual_seed(0)
    m = Tracker("mamba", 2, 2, hidden=8)
    ds = analyze_tracker(m, WordProblem(get_group("C2")), SPEC, horizon=40, t_ref=10)
    for name in ("q", "R", "M", "R_par", "R_perp", "q_par", "T_cross", "failure_mode", "return_map_eig_real", "recovery_rate", "lyapunov", "sign_flip_frac"):
        assert name in ds, name
    np.testing.assert_allclose(ds.R.values**2, ds.R_par.values**2 + ds.R_perp.values**2, rtol=1e-9, atol=1e-12)
    # affine tracker: the return map on U has eigenvalues of the word's diagonal decays
    assert np.all(np.abs(ds.return_map_eig_real.values) <= 1.0 + 1e-9)


def test_analysis_spec_refuses_bad_values():
    with pytest.raises(ValueError):
        AnalysisSpec(n_samples=2)


def test_exploding_tracker_counts_as_failed_not_robust():
    """A linear RNN with spectral radius 3 overflows float64 within the horizon: the
    non-finite steps must count as crossed (q = inf), never as 'robust'."""
    torch.manual_seed(0)
    m = Tracker("linear-rnn", 6, 6, hidden=8).double()
    with torch.no_grad():
        m.cells[0].A.mul_(3.0)
    ds = analyze_tracker(m, WordProblem(get_group("S3")), SPEC, horizon=800, t_ref=10)
    t_blow = float(ds.blowup_t)
    assert np.isfinite(t_blow) and t_blow < 800
    for mode in ("failure_mode", "failure_mode_par"):
        assert str(ds[mode].values) in ("saturation", "climb"), mode
    assert float(ds.T_cross) <= t_blow and float(ds.T_cross_par) <= t_blow
    after = ds.sel(t=slice(t_blow, None))
    for name in ("q", "q_par", "R", "R_par", "R_perp"):
        assert np.isinf(after[name]).all(), name
    # the Corollary-1 fit only sees finite points
    assert np.isfinite(float(ds.eta))
