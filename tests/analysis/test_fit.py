"""The one line fit of the analyses (dynlab.analysis.fit.line_fit)."""

import numpy as np
import pytest

from dynlab.analysis.fit import line_fit


def test_line_fit_matches_least_squares_and_skips_non_finite_entries():
    rng = np.random.default_rng(0)
    t = np.arange(1.0, 21.0)
    v = 0.3 + 0.05 * t + 0.01 * rng.normal(size=t.size)
    slope, icpt = np.polyfit(t, v, 1)
    np.testing.assert_allclose(line_fit(t, v), (icpt, slope), rtol=1e-12, atol=0)
    gappy = v.copy()
    gappy[[2, 7]] = [np.nan, np.inf]
    keep = np.isfinite(gappy)
    slope, icpt = np.polyfit(t[keep], v[keep], 1)
    np.testing.assert_allclose(line_fit(t, gappy), (icpt, slope), rtol=1e-12, atol=0)


def test_line_fit_fits_columns_apart_and_gives_nan_without_two_distinct_steps():
    t = np.arange(5.0)
    v = np.stack([2.0 - t, np.full(5, np.nan), np.r_[1.0, np.full(4, np.nan)], 3.0 * t], axis=1)  # [T, 4]
    a, b = line_fit(t, v)
    np.testing.assert_allclose(a, [2.0, np.nan, np.nan, 0.0], rtol=1e-7, atol=1e-12)
    np.testing.assert_allclose(b, [-1.0, np.nan, np.nan, 3.0], rtol=1e-7, atol=1e-12)
    assert np.isnan(line_fit(np.ones(4), np.arange(4.0))).all()  # one distinct step: no line
    with pytest.raises(ValueError, match="allowed: t \\[T\\] with v \\[T\\] or \\[T, K\\]"):
        line_fit(t, np.zeros(3))
