"""The trivial group C1 (one class): every ratio is undefined, so the analyses give NaN
for it, with no numpy warning."""

from __future__ import annotations

import warnings

import numpy as np

from dynlab.analysis.geometry import geometry_over_time


def test_one_class_gives_nan_ratios_and_no_warning():
    rng = np.random.default_rng(0)
    h = rng.normal(size=(16, 12, 3))
    y = np.zeros((16, 12), dtype=np.int64)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "Mean of empty slice" would fail here
        geo = geometry_over_time(h, y, n_classes=1)
    assert np.isnan(geo["q"].values).all() and np.isnan(geo["M"].values).all()
    assert np.isnan(float(geo["T_cross_par_pred"])) and not bool(geo["crossed"])


def test_the_fit_level_averages_the_defined_steps_only():
    """Two classes present at every step: the level of the Corollary-1 fit is finite."""
    rng = np.random.default_rng(1)
    y = rng.integers(0, 2, size=(64, 10))
    h = np.stack([y * 4.0, -y * 4.0, np.zeros_like(y, dtype=float)], -1) + 0.01 * rng.normal(size=(64, 10, 3))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        geo = geometry_over_time(h, y, n_classes=2)
    assert np.isfinite(geo["M"].values).all() and not np.isnan(float(geo["e_U0"]))
