"""The fixed points of a tracker's return maps per symbolic state
(dynlab.tracking.analysis.fixed_points.per_state) on S3 trackers whose answers are set by
construction, and its memo of spectra against solving them again."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynlab.tracking.analysis.fixed_points.per_state import generator_power_words, tracker_fixed_points
from dynlab.tracking.groups import get_group
from helpers.s3 import E, INV, MUL, S3Tracker, s3_batch


def _reach(model, tokens: torch.Tensor) -> np.ndarray:
    with torch.no_grad():
        h = model.init_state(tokens.shape[0])
        for i in range(tokens.shape[1]):
            _, h = model.step(h, tokens[:, i])
    return h.numpy()


def _s3_u_basis(model) -> np.ndarray:
    """Orthonormal basis of U in the tracked layer: Q [e_g − e_g'; 0] spans it (5 dims)."""
    diffs = np.zeros((8, 5))
    for g in range(1, 6):
        diffs[0, g - 1], diffs[g, g - 1] = 1.0, -1.0
    q, _ = np.linalg.qr(model.Q.numpy() @ diffs)
    return q


def test_tracker_fixed_points_per_state_in_closed_form():
    """The smooth S3 tracker: each class vertex is a fixed point of any state-preserving word w,
    with DF_w = 0.9^|w| on the 3 token dims, λ^|w| on the regular representation, μ^|w| on the
    2 decaying dims.  Per token: ρ∥ = λ = 0.6 (U, the centred vertices), ρ⊥ = 0.9."""
    tr = S3Tracker("smooth", lam=0.6, nu=0.8, mu=0.5)
    tokens, labels = s3_batch(120, 12, seed=4)
    h = _reach(tr, tokens)
    group = get_group("S3")
    words = [[2, 2], [3, 3, 3], [3, int(INV[3])], [2, 0, 0, 2]]  # a transposition², a 3-cycle³, x x⁻¹, …
    for w in words:
        g = E
        for x in w:
            g = MUL[x, g]
        assert g == E, w
    ds = tracker_fixed_points(tr, words, h, labels[:, -1], n_classes=6, basis=_s3_u_basis(tr), starts=4)
    assert ds.sizes["state"] == 6
    assert (ds["fp_residual"].values < 1e-12).all()
    np.testing.assert_array_equal(ds["fp_count"].values, 1.0)
    np.testing.assert_allclose(ds["fp_rho_par"].values, 0.6, rtol=1e-10, atol=0)
    np.testing.assert_allclose(ds["fp_rho_perp"].values, 0.9, rtol=1e-10, atol=0)
    np.testing.assert_array_equal(ds["fp_stable"].values, 1.0)
    np.testing.assert_array_equal(ds["fp_dim"].values, 0)
    mods = np.hypot(ds["fp_eig_real"].values, ds["fp_eig_imag"].values)[0, :11]  # word [2, 2]
    np.testing.assert_allclose(np.sort(mods), np.sort([0.5**2] * 2 + [0.6**2] * 6 + [0.9**2] * 3), rtol=1e-10, atol=0)
    gens = generator_power_words(group)  # S3's generators give words a^{ord(a)}
    assert sorted(len(w) for w in gens) == [2, 3]
    for w in gens:
        assert group.product(w) == group.identity


def test_tracker_fixed_points_of_an_exact_affine_tracker_are_a_subspace():
    """The affine S3 tracker preserves every state exactly: F_w is the identity on the 6-dim
    representation, so its fixed set has dimension 6 (count NaN) and ρ∥ = 1."""
    tr = S3Tracker("affine", mu=0.5)
    tokens, labels = s3_batch(60, 8, seed=5)
    ds = tracker_fixed_points(tr, [[2, 2]], _reach(tr, tokens), labels[:, -1], n_classes=6,
                              basis=_s3_u_basis(tr), starts=3)
    assert np.isnan(ds["fp_count"].values).all()
    np.testing.assert_array_equal(ds["fp_dim"].values, 6)
    np.testing.assert_allclose(ds["fp_rho_par"].values, 1.0, rtol=1e-7, atol=1e-12)
    assert (ds["fp_residual"].values < 1e-12).all()
    np.testing.assert_array_equal(ds["fp_stable"].values, 0.0)


def test_max_states_leaves_the_rest_nan():
    tr = S3Tracker("smooth")
    tokens, labels = s3_batch(40, 6, seed=1)
    ds = tracker_fixed_points(tr, [[2, 2]], _reach(tr, tokens), labels[:, -1], n_classes=6, starts=1, max_states=2)
    assert (ds["fp_residual"].values[:2] < 1e-12).all() and np.isnan(ds["fp_residual"].values[2:]).all()


def test_absent_class_is_nan():
    tr = S3Tracker("smooth")
    tokens, labels = s3_batch(40, 6, seed=1)
    y = labels[:, -1]
    keep = y != 2
    ds = tracker_fixed_points(tr, [[2, 2]], _reach(tr, tokens)[keep], y[keep], n_classes=6, starts=2)
    assert np.isnan(ds["fp_residual"].sel(state=2)) and np.isnan(ds["fp_rho_par"]).all()
    assert (ds["fp_residual"].drop_sel(state=2).values < 1e-12).all()


@pytest.mark.parametrize("arch", ["mamba", "tanh-rnn"])
def test_memoised_spectra_give_the_numbers_of_solving_again(arch):
    """tracker_fixed_points with its memo (each distinct Jacobian's spectrum and SVD solved
    once) equals the path that solves them again for every state; the affine mamba maps share
    A_w across states, so there the memo is used."""
    import dynlab.analysis.fixed_points.finder as fpm
    import dynlab.tracking.analysis.fixed_points.per_state as tfp
    from dynlab.tracking.train import build_tracker
    from dynlab.tracking.spec import ModelSpec
    from dynlab.tracking.task import WordProblem

    task = WordProblem(get_group("S3"))
    tr = build_tracker(ModelSpec(arch=arch, hidden=8), task.n_tokens, task.n_classes, 0).double()
    tokens, labels = task.sample(torch.Generator().manual_seed(0), 96, 12)
    with torch.no_grad():
        h = tr(tokens, return_states=False).final_state.double().numpy()
    words = tfp.generator_power_words(task.group)  # a³, b² of S3: two maps per state
    basis = np.linalg.qr(np.random.default_rng(0).normal(size=(tr.layer_slice(-1).stop - tr.layer_slice(-1).start, 3)))[0]
    kw = dict(n_classes=6, basis=basis, starts=3)
    calls = []
    real = fpm._spectrum
    fpm._spectrum = lambda *a: calls.append(1) or real(*a)
    try:
        new = tfp.tracker_fixed_points(tr, words, h, labels[:, -1].numpy(), **kw)
        n_new = len(calls)
        old = tfp.tracker_fixed_points(tr, words, h, labels[:, -1].numpy(), memo=False, **kw)
    finally:
        fpm._spectrum = real
    for name in old.data_vars:
        np.testing.assert_allclose(new[name].values, old[name].values, rtol=1e-12, atol=1e-12, equal_nan=True,
                                   err_msg=name)
    if arch == "mamba":
        assert n_new < len(calls) - n_new  # solved once per word, not once per state
    assert np.isfinite(old["fp_rho_perp"].values).all() and np.isfinite(old["fp_rho_par"].values).all()
