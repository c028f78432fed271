"""The pre-registered horizon forecast: its definition and its score."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynlab.analysis.correlation import tcross_mp_correlation
from dynlab.tracking.analysis.preregistered import PREREGISTERED_DEFINITION, preregistered_forecast, preregistered_scores


def _ds() -> xr.Dataset:
    rng = np.random.default_rng(3)
    n = 12
    mp = rng.uniform(50, 600, n)
    th = mp * rng.uniform(0.8, 1.6, n)
    fd = mp * rng.uniform(0.9, 2.5, n)
    th[0], fd[1], th[2], fd[2] = np.nan, np.nan, np.nan, np.nan
    return xr.Dataset(
        {"T_horizon": ("run", th), "T_forecast_dec": ("run", fd), "mp": ("run", mp),
         "mp_censored": ("run", np.zeros(n, bool)), "horizon": ("run", np.full(n, 1000.0)),
         "status": ("run", np.array(["ok"] * (n - 1) + ["not-learned"]))},
        coords={"seed": ("run", np.arange(n) % 3)},
    )


def test_forecast_is_the_earlier_of_the_two_and_nan_only_when_both_are():
    ds = _ds()
    t = preregistered_forecast(ds).values
    th, fd = ds["T_horizon"].values, ds["T_forecast_dec"].values
    assert t[0] == fd[0] and t[1] == th[1] and np.isnan(t[2])
    np.testing.assert_array_equal(t[3:], np.minimum(th[3:], fd[3:]))
    assert PREREGISTERED_DEFINITION == "T_prereg = min(T_horizon, T_forecast_dec)"


def test_scores_are_the_correlation_of_the_ok_runs_of_the_seeds():
    ds = _ds()
    got = preregistered_scores(ds, seeds=[1, 2])
    keep = (ds["status"].values == "ok") & np.isin(ds["seed"].values, [1, 2])
    t = np.fmin(ds["T_horizon"].values, ds["T_forecast_dec"].values)[keep]
    for cens in ("drop", "replace"):
        want = tcross_mp_correlation(t, ds["mp"].values[keep], horizon=1000.0, censoring=cens,
                                     rng=np.random.default_rng(0))
        assert got[cens]["r"] == pytest.approx(want.pearson_r) and got[cens]["n"] == want.n_used
        assert got[cens]["r_ci"] == pytest.approx(want.pearson_ci)
    assert got["drop"]["n"] == int(keep.sum()) - 1  # run 2 (both forecasts NaN) is censored
    assert got["seeds"] == [1, 2]
