"""T_cross vs mp correlation: known-correlation data, scipy cross-checks, censoring counts."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from dynlab.analysis.correlation import tcross_mp_correlation


def _bivariate(n: int, rho: float, seed: int) -> tuple[np.ndarray, np.ndarray]:
    rng = np.random.default_rng(seed)
    cov = np.array([[1.0, rho], [rho, 1.0]])
    xy = rng.multivariate_normal([0.0, 0.0], cov, size=n)
    return 100 + 20 * xy[:, 0], 300 + 50 * xy[:, 1]  # T_cross-like and mp-like scales


def test_known_correlation_inside_ci_and_matches_scipy():
    rho = 0.7
    t_cross, mp = _bivariate(300, rho, seed=0)
    res = tcross_mp_correlation(t_cross, mp, n_boot=2000, rng=np.random.default_rng(1))
    assert res.pearson_r == pytest.approx(stats.pearsonr(t_cross, mp).statistic, abs=1e-12)
    assert res.spearman_rho == pytest.approx(stats.spearmanr(t_cross, mp).statistic, abs=1e-12)
    lo, hi = res.pearson_ci
    assert lo < res.pearson_r < hi and lo < rho < hi
    assert 0.05 < hi - lo < 0.25  # about 4 standard errors (1 - r^2)/sqrt(n) ~ 0.03
    assert res.n_used == res.n_runs == 300 and res.n_dropped == 0
    ds = res.to_dataset()
    assert float(ds["pearson_r_lo"]) == lo and ds["pearson_r"].attrs["units"] == "1"


def test_bootstrap_ci_matches_explicit_resampling():
    t_cross, mp = _bivariate(40, 0.5, seed=2)
    res = tcross_mp_correlation(t_cross, mp, n_boot=300, ci_level=0.9, rng=np.random.default_rng(3))
    idx = np.random.default_rng(3).integers(0, 40, size=(300, 40))
    r = [np.corrcoef(t_cross[i], mp[i])[0, 1] for i in idx]
    rho = [stats.spearmanr(t_cross[i], mp[i]).statistic for i in idx]
    np.testing.assert_allclose(res.pearson_ci, np.percentile(r, [5, 95]), rtol=1e-10)
    np.testing.assert_allclose(res.spearman_ci, np.percentile(rho, [5, 95]), rtol=1e-10)


def test_spearman_with_ties_matches_scipy():
    t_cross, mp = _bivariate(60, 0.4, seed=4)
    t_cross, mp = np.round(t_cross / 10), np.round(mp / 40)  # many ties
    res = tcross_mp_correlation(t_cross, mp, n_boot=10, rng=np.random.default_rng(5))
    assert res.spearman_rho == pytest.approx(stats.spearmanr(t_cross, mp).statistic, abs=1e-12)


def test_censoring_replace_and_drop():
    t_cross, mp = _bivariate(50, 0.6, seed=6)
    horizon, max_len = 200.0, 400.0
    t_cross[[0, 3, 7]] = np.nan  # never crossed
    mp = np.minimum(mp, max_len)
    mp[[3, 10]] = max_len  # passed every length; run 3 is censored in both
    n_mp = int((mp >= max_len).sum())
    rep = tcross_mp_correlation(t_cross, mp, horizon=horizon, max_length=max_len, n_boot=10, rng=np.random.default_rng(7))
    filled = np.where(np.isnan(t_cross), horizon, t_cross)
    assert rep.pearson_r == pytest.approx(stats.pearsonr(filled, mp).statistic, abs=1e-12)
    assert (rep.n_tcross_censored, rep.n_mp_censored, rep.n_both_censored) == (3, n_mp, 1)
    assert rep.n_used == 50 and rep.n_dropped == 0
    drop = tcross_mp_correlation(
        t_cross, mp, mp_censored=mp >= max_len, censoring="drop", n_boot=10, rng=np.random.default_rng(7)
    )
    keep = ~np.isnan(t_cross) & (mp < max_len)
    assert drop.n_used == int(keep.sum()) == 50 - 3 - n_mp + 1
    assert drop.n_dropped == 50 - drop.n_used
    assert drop.spearman_rho == pytest.approx(stats.spearmanr(t_cross[keep], mp[keep]).statistic, abs=1e-12)


def test_bad_input_raises():
    t_cross, mp = _bivariate(10, 0.5, seed=8)
    t_cross[0] = np.nan
    rng = np.random.default_rng(0)
    with pytest.raises(ValueError, match="horizon"):
        tcross_mp_correlation(t_cross, mp, rng=rng)
    with pytest.raises(ValueError, match="censoring"):
        tcross_mp_correlation(t_cross, mp, horizon=5, censoring="impute", rng=rng)
    with pytest.raises(ValueError, match="ci_level"):
        tcross_mp_correlation(t_cross, mp, horizon=5, ci_level=1.5, rng=rng)
