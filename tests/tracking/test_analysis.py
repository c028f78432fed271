"""The per-run analysis pipeline on trackers whose answers are known in advance."""

import numpy as np
import pytest
import torch

from dynlab.tracking.analysis.spec import AnalysisSpec
from dynlab.tracking.analysis.pipeline import analyze_tracker
from dynlab.tracking.groups import get_group
from dynlab.tracking.models import Tracker
from dynlab.tracking.task import WordProblem

from helpers.trackers import exact_tracker

SPEC = AnalysisSpec(n_samples=64, perturb_samples=32, perturb_steps=20, lyap_samples=4, lyap_steps=20, n_words=3)


def test_exact_affine_tracker_is_robust_and_neutral():
    task = WordProblem(get_group("S3"))
    ds = analyze_tracker(exact_tracker("S3"), task, SPEC, horizon=150, t_ref=20)
    # states are exactly the one-hot vertices: no scatter at all
    assert float(ds.R.max()) < 1e-12 and float(ds.q.max()) < 1e-12
    np.testing.assert_allclose(ds.M.values, np.sqrt(2.0), rtol=1e-12, atol=0)
    assert str(ds.failure_mode.values) == "robust" and np.isnan(float(ds.T_cross))
    # identity readout on one-hot vertices: its margin is the nearest-centroid one, τ = 1/2
    np.testing.assert_allclose(ds.tau_readout.values, 0.5, rtol=1e-12, atol=0)
    assert np.isnan(float(ds.T_cross_readout))
    # Theorem 1: the return map of a state-preserving word is the identity on U
    eig = ds.return_map_eig_real.values + 1j * ds.return_map_eig_imag.values
    np.testing.assert_allclose(eig, 1.0, rtol=1e-7, atol=1e-10)
    assert float(ds.return_map_dist_identity) < 1e-10
    # decoder-aligned ratios: no spread at all, every decoder reads every state
    for name in ("q_pair", "q_pair_out", "q_dec", "q_pair_ref", "q_dec_ref"):
        assert float(ds[name].max()) < 1e-10, name
        assert str(ds[f"failure_mode_{name[2:]}"].values) == "robust", name
    np.testing.assert_allclose(ds.probe_accuracy.values, 1.0)
    assert np.isnan(float(ds.T_probe)) and np.isnan(float(ds.T_forecast_dec))
    # the readout features of this tracker are its states, so the two pairwise ratios agree
    assert ds.q_pair_out.attrs["representation"] == "readout features" and ds.q_pair.attrs["representation"] == "state"
    assert int(ds.k_U_ref) == 5
    # permutations are orthogonal: perturbations neither grow nor decay, exponents are 0
    np.testing.assert_allclose(ds.recovery_rate.values, 0.0, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(ds.lyapunov.values, 0.0, rtol=1e-7, atol=1e-10)
    # every return map is the identity on the one-hot states: each class sits in a fixed
    # subspace of dimension 6 (no isolated count), neutral along U and U⊥, not stable
    np.testing.assert_array_equal(ds.fp_residual.values, 0.0)
    assert np.isnan(ds.fp_count.values).all()
    np.testing.assert_array_equal(ds.fp_dim.values, 6)
    np.testing.assert_allclose(ds.fp_rho_par.values, 1.0, rtol=1e-7, atol=1e-12)
    np.testing.assert_array_equal(ds.fp_stable.values, 0.0)
    assert ds.fp_residual.attrs["fp_words"].startswith("3 3 3; 2 2; ")  # a^ord(a) per generator, then a random word
    # Corollary 1 from the return maps: every word returns each centroid exactly, so no drift
    # along U and no predicted crossing (R∥ = 0 < τ·M)
    assert float(ds.fp_drift) < 1e-12 and np.isnan(float(ds.T_cross_fp))


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
    np.testing.assert_allclose(np.abs(eig), lam**SPEC.word_length, rtol=1e-9, atol=0)
    # DF_U = λ^L·I on U: its distance from the identity is 1 − λ^L
    np.testing.assert_allclose(float(ds.return_map_dist_identity), 1 - lam**SPEC.word_length, rtol=1e-9, atol=0)
    np.testing.assert_allclose(ds.recovery_rate.values, np.log(lam), rtol=1e-6, atol=0)
    np.testing.assert_allclose(ds.lyapunov.values, np.log(lam), rtol=1e-6, atol=0)
    assert str(ds.failure_mode.values) == "robust"
    # each vertex is the one fixed point of its class, contracting by λ per token everywhere
    assert (ds.fp_residual.values < 1e-12).all()
    np.testing.assert_array_equal(ds.fp_count.values, 1.0)
    np.testing.assert_allclose(ds.fp_rho_par.values, lam, rtol=1e-12, atol=0)
    np.testing.assert_allclose(ds.fp_rho_perp.values, lam, rtol=1e-12, atol=0)
    np.testing.assert_array_equal(ds.fp_stable.values, 1.0)


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


@pytest.mark.slow
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


def test_collapsed_tracker_is_not_robust():
    """Every state maps to zero after the first step: all classes merge, so every ratio is
    +inf from step 2 and the tracker has failed (it was 'robust' when q = 0/0 counted as
    below the threshold)."""
    m = exact_tracker("C6")
    with torch.no_grad():
        m.cells[0].P.zero_()
    ds = analyze_tracker(m, WordProblem(get_group("C6")), SPEC, horizon=30, t_ref=10)
    for name in ("failure_mode", "failure_mode_par", "failure_mode_pair", "failure_mode_pair_out", "failure_mode_dec"):
        assert str(ds[name].values) == "saturation", name
    assert np.isinf(ds.q.sel(t=slice(2, None))).all() and np.isinf(ds.q_pair.sel(t=slice(2, None))).all()
    assert float(ds.probe_accuracy.sel(t=20)) < 0.5


def test_large_groups_get_enough_sequences_per_class():
    spec = AnalysisSpec(n_samples=128)
    assert spec.samples_for(6) == 128 and spec.samples_for(60) == 960 and spec.samples_for(120) == 1920
    assert AnalysisSpec(n_samples=128, max_samples=1000).samples_for(120) == 1000


def test_state_preserving_words_are_checked():
    from dynlab.tracking.analysis.pipeline import _check_state_preserving

    task = WordProblem(get_group("S3"))
    words = task.sample_identity_words(torch.Generator().manual_seed(0), 8, 5)
    _check_state_preserving(task, words)  # closed by their inverse: accepted
    bad = words.clone()
    bad[0, -1] = (bad[0, -1] + 1) % 6
    with pytest.raises(ValueError, match="multiply to the identity"):
        _check_state_preserving(task, bad)
