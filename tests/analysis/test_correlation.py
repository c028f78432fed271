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
    assert res.pearson_r == pytest.approx(stats.pearsonr(t_cross, mp).statistic, rel=0, abs=1e-12)
    assert res.spearman_rho == pytest.approx(stats.spearmanr(t_cross, mp).statistic, rel=0, abs=1e-12)
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
    np.testing.assert_allclose(res.pearson_ci, np.percentile(r, [5, 95]), rtol=1e-10, atol=0)
    np.testing.assert_allclose(res.spearman_ci, np.percentile(rho, [5, 95]), rtol=1e-10, atol=0)


def test_spearman_with_ties_matches_scipy():
    t_cross, mp = _bivariate(60, 0.4, seed=4)
    t_cross, mp = np.round(t_cross / 10), np.round(mp / 40)  # many ties
    res = tcross_mp_correlation(t_cross, mp, n_boot=10, rng=np.random.default_rng(5))
    assert res.spearman_rho == pytest.approx(stats.spearmanr(t_cross, mp).statistic, rel=0, abs=1e-12)


def test_censoring_replace_and_drop():
    t_cross, mp = _bivariate(50, 0.6, seed=6)
    horizon, max_len = 200.0, 400.0
    t_cross[[0, 3, 7]] = np.nan  # never crossed
    mp = np.minimum(mp, max_len)
    mp[[3, 10]] = max_len  # passed every length; run 3 is censored in both
    n_mp = int((mp >= max_len).sum())
    rep = tcross_mp_correlation(t_cross, mp, horizon=horizon, max_length=max_len, n_boot=10, rng=np.random.default_rng(7))
    filled = np.where(np.isnan(t_cross), horizon, t_cross)
    assert rep.pearson_r == pytest.approx(stats.pearsonr(filled, mp).statistic, rel=0, abs=1e-12)
    assert (rep.n_tcross_censored, rep.n_mp_censored, rep.n_both_censored) == (3, n_mp, 1)
    assert rep.n_used == 50 and rep.n_dropped == 0
    drop = tcross_mp_correlation(
        t_cross, mp, mp_censored=mp >= max_len, censoring="drop", n_boot=10, rng=np.random.default_rng(7)
    )
    keep = ~np.isnan(t_cross) & (mp < max_len)
    assert drop.n_used == int(keep.sum()) == 50 - 3 - n_mp + 1
    assert drop.n_dropped == 50 - drop.n_used
    assert drop.spearman_rho == pytest.approx(stats.spearmanr(t_cross[keep], mp[keep]).statistic, rel=0, abs=1e-12)


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


def test_correlation_table_and_heldout_choice_never_see_the_heldout_half():
    from dynlab.analysis.correlation import correlation_table, heldout_choice

    rng = np.random.default_rng(0)
    seeds = np.repeat(np.arange(4), 30)  # seeds 0, 1 select; 2, 3 are held out
    mp = rng.uniform(10, 900, seeds.size)
    good = mp + rng.normal(0, 5, seeds.size)  # tracks mp on every seed
    # 'sly' tracks mp perfectly on the selection half only and is noise on the held-out half
    sly = np.where(seeds < 2, mp, rng.uniform(10, 900, seeds.size))
    noise = rng.uniform(10, 900, seeds.size)
    cens = np.zeros(seeds.size, bool)
    choice = heldout_choice({"good": good, "sly": sly, "noise": noise}, mp, seeds, horizon=1000.0, mp_censored=cens)
    assert choice["selection_seeds"] == [0, 1] and choice["heldout_seeds"] == [2, 3]
    assert choice["variant"] == "sly"  # chosen on the selection half (r = 1 there) ...
    held = seeds >= 2
    expect = np.corrcoef(sly[held], mp[held])[0, 1]  # ... and reported honestly on the other half
    assert choice["pearson_r"] == pytest.approx(expect, rel=0, abs=1e-12) and choice["n_used"] == 60
    assert choice["pearson_r_lo"] < expect < choice["pearson_r_hi"]
    one = heldout_choice({"good": good}, mp, np.zeros(seeds.size), horizon=1000.0, mp_censored=cens)
    assert one["variant"] == "q_dec" and np.isnan(one["pearson_r"])  # one seed: no split, a-priori default

    # table: censored crossings replaced by their own run's horizon, or dropped
    tc = good.copy()
    tc[:10] = np.nan
    horizon = np.where(np.arange(seeds.size) < 5, 500.0, 1000.0)
    tab = correlation_table({"good": tc}, mp, horizon=horizon, mp_censored=cens, n_boot=200)
    replaced = np.where(np.isnan(tc), horizon, tc)
    r_rep = float(tab.corr_r.sel(variant="good", censoring="replace"))
    r_drop = float(tab.corr_r.sel(variant="good", censoring="drop"))
    assert r_rep == pytest.approx(np.corrcoef(replaced, mp)[0, 1], rel=0, abs=1e-12)
    assert r_drop == pytest.approx(np.corrcoef(tc[10:], mp[10:])[0, 1], rel=0, abs=1e-12)
    assert int(tab.corr_n.sel(variant="good", censoring="drop")) == seeds.size - 10


def test_study_correlations_merge_table_heldout_and_default_scalars():
    """group-tracking's correlation block on a dataset of 40 runs over 4 seeds: ok runs only,
    one table over variants × censoring, the held-out choice and the default's scalars."""
    import xarray as xr

    from dynlab.analysis.correlation import format_correlation_report, study_correlations

    rng = np.random.default_rng(1)
    n = 40
    mp = rng.uniform(20, 1000, n)
    status = np.array(["ok"] * 36 + ["not-learned"] * 4)
    t_dec = np.where(mp > 900, np.nan, mp * 1.1)  # the decoder ratio tracks mp; censored when robust
    ds = xr.Dataset(
        {
            "mp": ("run", mp),
            "mp_censored": ("run", mp > 900),
            "status": ("run", status),
            "horizon": ("run", np.full(n, 1000.0)),
            "T_cross": ("run", rng.uniform(1, 5, n)),
            "T_cross_dec": ("run", t_dec),
            "T_forecast_dec": ("run", t_dec * 0.9),
        },
        coords={"run": np.arange(n), "seed": ("run", np.repeat(np.arange(4), 10))},
    )
    ds["mp"][36:] = 0.0  # non-learners would pull r up if they counted
    out = study_correlations(ds)
    assert list(out["variant"].values) == ["q", "q_dec", "forecast_dec"]
    assert int(out["corr_n"].sel(variant="q_dec", censoring="replace")) == 36  # not-learned left out
    assert out.attrs["corr_default_variant"] == "q_dec"  # chosen on seeds 0, 1 among crossing variants
    assert out["corr_heldout_pearson_r"].attrs["variant"] == "q_dec"
    held = (ds.seed.values >= 2) & (status == "ok")
    expect = np.corrcoef(np.where(np.isnan(t_dec), 1000.0, t_dec)[held], mp[held])[0, 1]
    assert float(out["corr_heldout_pearson_r"]) == pytest.approx(expect, rel=0, abs=1e-12)
    assert float(out["corr_pearson_r"]) == pytest.approx(float(out["corr_r"].sel(variant="q_dec", censoring="replace")))
    merged = ds.merge(out)
    merged.attrs.update(out.attrs)
    report = format_correlation_report(merged)
    assert "| q_dec |" in report and "held-out seeds [2, 3]" in report


def test_heldout_forecasts_score_only_the_held_out_seeds():
    """A forecast equal to log mp on seeds 2-3 and noise on seeds 0-1 scores its held-out r, and
    that r equals tcross_mp_correlation on the held-out runs alone."""
    from dynlab.analysis.correlation import heldout_forecasts, tcross_mp_correlation

    rng = np.random.default_rng(3)
    seeds = np.repeat([0, 1, 2, 3], 10)
    mp = rng.uniform(10, 500, seeds.size)
    good = np.where(seeds >= 2, 3.0 * mp + 1.0, rng.uniform(1, 1000, seeds.size))
    bad = rng.uniform(1, 1000, seeds.size)
    out = heldout_forecasts({"good": good, "bad": bad}, mp, seeds, horizon=1000.0,
                            mp_censored=np.zeros(seeds.size, bool), n_boot=50)
    assert float(out["corr_forecast_heldout_r"].sel(forecast="good", censoring="drop")) == pytest.approx(1.0)
    held = seeds >= 2
    ref = tcross_mp_correlation(bad[held], mp[held], horizon=1000.0, mp_censored=np.zeros(held.sum(), bool),
                                censoring="replace", n_boot=50, rng=np.random.default_rng(0))
    assert float(out["corr_forecast_heldout_r"].sel(forecast="bad", censoring="replace")) == pytest.approx(ref.pearson_r)
    assert int(out["corr_forecast_heldout_n"].sel(forecast="bad", censoring="replace")) == ref.n_used == 20
    assert out["corr_forecast_heldout_r"].attrs["heldout_seeds"] == "[2, 3]"
    assert not heldout_forecasts({"good": good}, mp, np.zeros(seeds.size, int), horizon=1000.0,
                                 mp_censored=np.zeros(seeds.size, bool)).data_vars


def test_correlation_table_counts_its_runs_even_when_too_few_to_correlate():
    """3 runs, 2 of them with a censored crossing: under 'drop' one run is usable, too few
    for a correlation (NaN), but corr_n says 1, not NaN; under 'replace' all 3 are used."""
    import numpy as np

    from dynlab.analysis.correlation import correlation_table

    tc = np.array([5.0, np.nan, np.nan])
    mp = np.array([10.0, 20.0, 30.0])
    tab = correlation_table({"v": tc}, mp, horizon=np.array([50.0, 50.0, 50.0]), mp_censored=np.zeros(3, bool), n_boot=50)
    drop, replace = tab.sel(variant="v", censoring="drop"), tab.sel(variant="v", censoring="replace")
    assert int(drop["corr_n"]) == 1 and np.isnan(float(drop["corr_r"]))
    assert int(replace["corr_n"]) == 3 and np.isfinite(float(replace["corr_r"]))
