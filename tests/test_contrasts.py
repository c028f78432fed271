"""Paired contrasts of post-training arms against the zero control, against scipy's paired t-test."""

from __future__ import annotations

import numpy as np
import xarray as xr
from scipy import stats

from dynlab.analysis.contrasts import paired_contrasts, paired_summary


def _dataset(acc: dict[tuple[str, int], np.ndarray], status: dict[tuple[str, int], str] | None = None) -> xr.Dataset:
    keys = list(acc)
    status = status or {}
    return xr.Dataset(
        {"accuracy": (("run", "length"), np.stack([acc[k] for k in keys])),
         "status": ("run", [status.get(k, "ok") for k in keys])},
        coords={"length": [8, 48], "arch": ("run", ["mamba2"] * len(keys)),
                "intervention": ("run", [k[0] for k in keys]), "seed": ("run", [k[1] for k in keys]),
                "phase": ("run", ["post"] * len(keys))})


def test_summary_equals_scipy_paired_t():
    rng = np.random.default_rng(0)
    a, b = rng.random((5, 3)), rng.random((5, 3))
    mean, lo, hi, p = paired_summary(a - b)
    for j in range(3):
        res = stats.ttest_rel(a[:, j], b[:, j])
        ci = res.confidence_interval(0.95)
        np.testing.assert_allclose([mean[j], lo[j], hi[j], p[j]], [np.mean(a[:, j] - b[:, j]), ci.low, ci.high, res.pvalue])


def test_contrasts_pair_by_seed_and_skip_models_that_did_not_learn():
    acc = {("zero", 0): np.array([0.9, 0.4]), ("state-passing", 0): np.array([0.95, 0.6]),
           ("zero", 1): np.array([0.8, 0.3]), ("state-passing", 1): np.array([0.9, 0.35]),
           ("zero", 2): np.array([0.7, 0.1]), ("state-passing", 2): np.array([0.1, 0.1])}
    ds = paired_contrasts(_dataset(acc, {("state-passing", 2): "diverged"}))
    diffs = np.array([[0.05, 0.2], [0.1, 0.05]])  # seed 2's arm did not finish: its pair is out
    np.testing.assert_allclose(ds["contrast_mean"].sel(mixer="mamba2", contrast="state-passing"), diffs.mean(0))
    assert int(ds["contrast_n"].sel(mixer="mamba2", contrast="state-passing")) == 2
    res = stats.ttest_rel([0.95, 0.9], [0.9, 0.8])
    np.testing.assert_allclose(float(ds["contrast_p"].sel(mixer="mamba2", contrast="state-passing", length=8)), res.pvalue)


def test_one_pair_has_a_mean_and_no_interval():
    ds = paired_contrasts(_dataset({("zero", 0): np.array([0.5, 0.5]), ("fitted-noise", 0): np.array([0.7, 0.2])}))
    np.testing.assert_allclose(ds["contrast_mean"].sel(mixer="mamba2", contrast="fitted-noise"), [0.2, -0.3])
    assert np.isnan(ds["contrast_lo"]).all() and np.isnan(ds["contrast_p"]).all()
