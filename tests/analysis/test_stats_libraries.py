"""The statistics dynlab takes from scipy give what the hand-written formulas gave, on fixed
inputs: the paired t-interval and p-value (``scipy.stats.ttest_rel``), the percentile
bootstrap of a mean (``scipy.stats.bootstrap``), and the percentile bootstrap of Pearson r
(``scipy.stats.pearsonr(...).confidence_interval``), which the correlation report keeps
computing itself for the reasons its module states; here it is checked against scipy's."""

from __future__ import annotations

import warnings

import numpy as np
import pytest
from scipy import stats

from dynlab.analysis.contrasts import bootstrap_mean_ci, paired_summary
from dynlab.analysis.correlation import tcross_mp_correlation

#: The agreement asked of two computations of one formula in float64 (rounding only).
RTOL = 1e-10


def reference_paired_summary(d: np.ndarray):
    """The paired t-summary written out (what dynlab computed by hand before it used scipy):
    mean, mean ∓ t_{0.975,n−1}·sd/√n (zero width when sd = 0), p = 2·sf(|mean/(sd/√n)|)
    (NaN when sd = 0); NaN intervals and p for n < 2."""
    d = np.asarray(d, dtype=float)
    n = d.shape[0]
    nan = np.full(d.shape[1:], np.nan)
    if n == 0:
        return nan, nan, nan, nan
    mean = d.mean(axis=0)
    if n < 2:
        return mean, nan, nan, nan
    sd = d.std(axis=0, ddof=1)
    half = stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        p = np.where(sd > 0, 2 * stats.t.sf(np.abs(mean / (sd / np.sqrt(n))), n - 1), np.nan)
    return mean, mean - half, mean + half, p


def _cases() -> list[np.ndarray]:
    g = np.random.default_rng(20261203)
    cases = [g.normal(0.3, 1.0, size=(n, 3, 2)) for n in (2, 3, 5, 17)]
    tied = g.normal(size=(6, 4))
    tied[:, 1] = 0.25  # every difference equal: a zero-width interval, no p
    tied[:, 2] = 0.0
    tied[2, 3] = np.nan  # a missing difference: NaN throughout, as before
    cases += [tied, g.normal(size=8), np.array([0.5]), np.zeros((0, 3)), np.array([1.0, 1.0, 1.0]),
              np.array([0.1 + 0.2, 0.3, 0.3, 0.1 + 0.2])]  # equal but for rounding: one ulp apart
    return cases


@pytest.mark.parametrize("d", _cases(), ids=lambda d: f"shape{d.shape}")
def test_the_paired_summary_is_the_written_out_t_test(d):
    got, want = paired_summary(d), reference_paired_summary(d)
    for name, g, w in zip(("mean", "lo", "hi", "p"), got, want):
        assert np.shape(g) == np.shape(w), name
        np.testing.assert_allclose(g, w, rtol=RTOL, atol=1e-15, equal_nan=True, err_msg=name)


def test_the_paired_summary_is_scipys_paired_t_test():
    g = np.random.default_rng(7)
    arm, control = g.normal(1.0, 1.0, size=9), g.normal(0.5, 1.0, size=9)
    mean, lo, hi, p = paired_summary(arm - control)
    res = stats.ttest_rel(arm, control)
    ci = res.confidence_interval(0.95)
    np.testing.assert_allclose([mean, lo, hi, p], [np.mean(arm - control), ci.low, ci.high, res.pvalue], rtol=RTOL, atol=0)


def test_the_reference_can_fail():
    d = np.array([0.1, 0.4, -0.2, 0.3])
    mean, lo, hi, p = reference_paired_summary(d)
    z = stats.norm.ppf(0.975) * d.std(ddof=1) / 2  # a normal, not a t, interval: wider t is told apart
    assert hi - lo > 2 * z * (1 + 1e-3) and 0 < p < 1


def test_the_mean_bootstrap_is_the_percentile_bootstrap_of_its_seed():
    """scipy's percentile bootstrap draws the resamples as rng.integers(0, n, (B, n)): the
    interval is the percentiles of those resamples' means, to rounding."""
    d = np.random.default_rng(3).normal(0.2, 1.0, size=9)
    lo, hi = bootstrap_mean_ci(d, level=0.9, n_resamples=4999, seed=5)
    idx = np.random.default_rng(5).integers(0, d.size, size=(4999, d.size))
    np.testing.assert_allclose((lo, hi), np.percentile(d[idx].mean(axis=1), [5, 95]), rtol=RTOL, atol=0)
    assert bootstrap_mean_ci(d, seed=6) != bootstrap_mean_ci(d, seed=5)  # the seed is used


def test_the_correlation_bootstrap_is_scipys_pearson_interval_when_no_resample_is_degenerate():
    g = np.random.default_rng(1)
    a = g.normal(size=30)
    b = a + g.normal(size=30)
    res = tcross_mp_correlation(a, b, n_boot=2000, rng=np.random.default_rng(7))
    scipy_r = stats.pearsonr(a, b)
    ci = scipy_r.confidence_interval(0.95, method=stats.BootstrapMethod(method="percentile", n_resamples=2000,
                                                                        rng=np.random.default_rng(7)))
    assert res.n_boot_degenerate == 0
    np.testing.assert_allclose(res.pearson_r, scipy_r.statistic, rtol=RTOL, atol=0)
    np.testing.assert_allclose(res.pearson_ci, (ci.low, ci.high), rtol=RTOL, atol=0)


def test_the_correlation_bootstrap_leaves_out_degenerate_resamples_which_scipy_cannot():
    """With 4 runs some resamples repeat one run: no correlation.  dynlab leaves them out and
    counts them; scipy's Pearson interval would be NaN there, which is why the correlation
    report keeps its own bootstrap."""
    a, b = np.array([1.0, 2.0, 4.0, 3.0]), np.array([10.0, 30.0, 35.0, 20.0])
    res = tcross_mp_correlation(a, b, n_boot=500, rng=np.random.default_rng(0))
    assert res.n_boot_degenerate > 0 and np.all(np.isfinite(res.pearson_ci))
    assert -1 <= res.pearson_ci[0] <= res.pearson_r <= res.pearson_ci[1] <= 1
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # scipy's notices of the constant resamples
        ci = stats.pearsonr(a, b).confidence_interval(0.95, method=stats.BootstrapMethod(
            method="percentile", n_resamples=500, rng=np.random.default_rng(0)))
    assert np.isnan(ci.low) and np.isnan(ci.high)
