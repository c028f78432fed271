"""The fixed-point mechanism statistics across runs (dynlab.tracking.analysis.fixed_points.mechanism)."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynlab.tracking.analysis.fixed_points.mechanism import mechanism_correlations, run_fixed_point_summary


def _ds() -> xr.Dataset:
    """10 runs, 3 states: ρ⊥ = exp(rate⊥) and ρ∥ = exp(rate∥) exactly at every state (so the
    recovery correlations are 1); run 9 has no fixed point (NaN) and status not-learned."""
    rng = np.random.default_rng(0)
    n, g = 10, 3
    rate = -rng.uniform(0.01, 1.5, (n, 2))  # [run, (U, U_perp)]
    rho_par = np.repeat(np.exp(rate[:, :1]), g, 1)
    rho_perp = np.repeat(np.exp(rate[:, 1:]), g, 1)
    res = np.full((n, g), 1e-14)
    rho_par[8, 1] = np.nan  # an absent state: left out of the median
    res[8, 1] = np.nan
    rho_par[9], rho_perp[9], res[9] = np.nan, np.nan, 0.3
    mp = 100 + 900 * (1 - np.exp(rate[:, 0]))
    return xr.Dataset(
        {"fp_rho_par": (("run", "state"), rho_par), "fp_rho_perp": (("run", "state"), rho_perp),
         "fp_residual": (("run", "state"), res), "recovery_rate": (("run", "direction"), rate),
         "mp": ("run", mp), "mp_censored": ("run", mp > 900), "status": ("run", np.array(["ok"] * 9 + ["not-learned"])),
         "failure_mode_dec": ("run", np.array(["robust", "climb"] * 5))},
        coords={"run": np.arange(n), "state": np.arange(g), "direction": ["U", "U_perp"],
                "family": ("run", np.array(["state-dependent"] * 4 + ["affine"] * 6))},
    )


def test_summary_is_the_median_over_present_states():
    ds = _ds()
    s = run_fixed_point_summary(ds)
    np.testing.assert_allclose(s["rho_par"].values[:9], np.exp(ds["recovery_rate"].values[:9, 0]))
    np.testing.assert_allclose(s["par_dev"].values[:9], 1 - np.exp(ds["recovery_rate"].values[:9, 0]))
    assert s["found"].values[:9].all() and not s["found"].values[9] and np.isnan(s["rho_perp"].values[9])


def test_log_rho_equals_the_recovery_rate_gives_r_one():
    ds = _ds()
    out = mechanism_correlations(ds)
    assert out["n_ok"] == 9 and out["found"] == 9
    assert out["recovery_perp"]["r"] == pytest.approx(1.0) and out["recovery_perp"]["n"] == 9
    assert out["recovery_par"]["rho"] == pytest.approx(1.0)
    # mp = 100 + 900·|ρ∥ − 1| by construction: r = 1 under 'replace'; 'drop' leaves out mp > 900
    assert out["mp_par_dev_replace"]["r"] == pytest.approx(1.0)
    assert out["mp_par_dev_drop"]["n"] == int((ds["mp"].values[:9] <= 900).sum())
    assert out["modes"]["robust"]["n"] == 5 and out["modes"]["climb"]["n"] == 4
    assert out["state_dependent"] == {"n": 4, "found": 4}


def test_corollary1_correlations_censoring():
    """T_cross_fp = T_cross_par exactly on the runs where both crossed: r = 1 under 'drop'; a run
    whose T_cross_par never happened (NaN) is left out under 'drop' and set to its horizon under
    'replace'; T_cross_fp NaN counts as never too."""
    from dynlab.tracking.analysis.fixed_points.mechanism import corollary1_correlations

    ds = _ds()
    t = np.array([70.0, 90, 120, 200, 300, 80, 150, 400, np.nan, 60])
    par = t.copy()
    par[7] = np.nan  # never crossed within the horizon
    ds["T_cross_fp"] = ("run", t)
    ds["T_cross_par"] = ("run", par)
    ds["T_cross_dec"] = ("run", 2 * t)
    ds["horizon"] = ("run", np.full(10, 1000.0))
    out = corollary1_correlations(ds)
    assert out["n_ok"] == 9 and out["predicted"] == 8
    assert out["par_drop"]["n"] == 7 and out["par_drop"]["r"] == pytest.approx(1.0)
    assert out["par_replace"]["n"] == 9 and out["par_replace"]["r"] < 1.0
    assert out["dec_drop"]["r"] == pytest.approx(1.0)
    assert set(out) >= {"mp_replace", "mp_drop"}
    with pytest.raises(ValueError, match="T_cross_fp"):
        corollary1_correlations(ds.drop_vars("T_cross_fp"))


def test_within_family_correlations_match_scipy_on_each_family():
    """Beside every pooled correlation, the same one within each family: equal to scipy's
    Pearson r and Spearman ρ on that family's runs alone (an independent computation)."""
    from scipy import stats

    ds = _ds()
    rng = np.random.default_rng(3)
    ds["recovery_rate"].values[:, 1] += rng.normal(0, 0.3, 10)  # break the exact pooled r = 1
    out = mechanism_correlations(ds)
    fam = ds["family"].values[:9]
    s = run_fixed_point_summary(ds.isel(run=slice(0, 9)))
    for family in ("affine", "state-dependent"):
        sel = fam == family
        x, y = np.log(s["rho_perp"].values[sel]), ds["recovery_rate"].values[:9, 1][sel]
        got = out["by_family"][family]["recovery_perp"]
        np.testing.assert_allclose(got["r"], stats.pearsonr(x, y).statistic, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(got["rho"], stats.spearmanr(x, y).statistic, rtol=1e-12, atol=1e-12)
        assert got["n"] == int(sel.sum())
        mp = ds["mp"].values[:9][sel]
        np.testing.assert_allclose(out["by_family"][family]["mp_rho_perp_replace"]["r"],
                                   stats.pearsonr(s["rho_perp"].values[sel], mp).statistic, rtol=1e-12, atol=1e-12)
    # the pooled value is not any family's
    assert out["recovery_perp"]["r"] != pytest.approx(out["by_family"]["affine"]["recovery_perp"]["r"])


def test_pooled_r_is_called_the_family_split_when_one_family_is_all_censored():
    ds = _ds()
    out = mechanism_correlations(ds)
    assert out["censored_families"] == []  # some state-dependent runs have mp <= 900
    ds["mp"].values[:4] = 1000.0
    ds["mp_censored"].values[:4] = True
    out = mechanism_correlations(ds)
    assert out["censored_families"] == ["state-dependent"]
    # under 'drop' nothing of that family is left: its within-family r is NaN, n 0
    assert out["by_family"]["state-dependent"]["mp_rho_perp_drop"]["n"] == 0
