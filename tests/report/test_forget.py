"""The state preset's rule (dynlab.lm.report.forget) on datasets whose answer is known."""

from __future__ import annotations

import numpy as np
import pytest
import xarray as xr

from dynlab.lm.report.forget import contraction_correlations, forget_fit, forget_grid, forget_thresholds, state_tables

LENGTHS = (16, 32, 64, 128, 256)


def _dataset(threshold, sizes=(1024, 4096, 16384), seeds=(0, 1, 2), status=None, horizon=None):
    """A run rises (far/in 1.3) below ``threshold(size, seed)`` and not (1.01) from it on."""
    rows = [(s, t, seed) for s in sizes for t in LENGTHS for seed in seeds]
    ratio = [1.3 if t < threshold(s, seed) else 1.01 for s, t, seed in rows]
    ds = xr.Dataset(
        {"far_in_ratio": ("run", ratio),
         "status": ("run", [status(s, t, seed) if status else "ok" for s, t, seed in rows]),
         "converged": ("run", [True] * len(rows))},
        coords={"state_size": ("run", [r[0] for r in rows]), "train_length": ("run", [r[1] for r in rows]),
                "seed": ("run", [r[2] for r in rows]), "d_model": ("run", [32] * len(rows))})
    if horizon is not None:
        ds["memory_horizon"] = ("run", [horizon(s, t, seed) for s, t, seed in rows])
    return ds


def test_thresholds_and_a_linear_fit_are_recovered():
    # T_forget = 16 + size / 128: 24 -> 32, 48 -> 64, 144 -> 256 (the first length not below it)
    line = {1024: 32, 4096: 64, 16384: 256}
    th = forget_thresholds(forget_grid(_dataset(lambda s, seed: line[s])))
    assert th["t_forget"].sel(seed=0).values.tolist() == [32.0, 64.0, 256.0]
    assert (th["censored"] == "").all()
    fit = forget_fit(th)
    x = np.array([1024, 4096, 16384], dtype=float)
    expect = np.polyfit(x, [32, 64, 256], 1)
    assert fit["n"] == 9 and fit["slope"] == pytest.approx(expect[0]) and fit["intercept"] == pytest.approx(expect[1])
    assert fit["slope_lo"] < fit["slope"] < fit["slope_hi"]


def test_censoring_and_a_late_rise():
    th = forget_thresholds(forget_grid(_dataset(lambda s, seed: {1024: 0, 4096: 10**6, 16384: 64}[s])))
    assert th["censored"].sel(state_size=1024).values.tolist() == ["below"] * 3
    assert th["censored"].sel(state_size=4096).values.tolist() == ["above"] * 3
    assert np.isnan(th["t_forget"].sel(state_size=4096)).all()
    # a rise at T_train 256 after quiet runs: T_forget stays the first quiet one, the rise is counted
    ds = _dataset(lambda s, seed: 32)
    ds["far_in_ratio"] = ds["far_in_ratio"].where(ds["train_length"] != 256, 1.2)
    th = forget_thresholds(forget_grid(ds))
    assert (th["t_forget"] == 32).all() and (th["later_rises"] == 1).all()
    assert "9 run(s) rise above their cell's T_forget" in state_tables(ds)


def test_unlearned_runs_are_left_out_and_counted():
    ds = _dataset(lambda s, seed: 64, status=lambda s, t, seed: "diverged" if t == 128 and seed == 0 else "ok")
    th = forget_thresholds(forget_grid(ds))
    assert th["unlearned"].sel(seed=0).values.tolist() == [1, 1, 1]
    assert th["t_forget"].sel(seed=0).values.tolist() == [64.0, 64.0, 64.0]


def test_contraction_correlations_pooled_and_within_with_holm():
    ds = _dataset(lambda s, seed: 64, horizon=lambda s, t, seed: 5000.0 / t + seed)  # long horizon <-> rise
    rows = contraction_correlations(forget_grid(ds))
    assert [r["group"] for r in rows] == ["pooled", "state 1024", "state 4096", "state 16384"]
    assert all(r["rho"] > 0.8 for r in rows) and all(r["p_holm"] >= r["p"] for r in rows)
    assert "| pooled | 45 |" in state_tables(ds)


def test_a_state_map_is_one_width_with_several_states():
    from dynlab.lm.report.forget import is_state_map

    ds = _dataset(lambda s, seed: 64)
    assert is_state_map(ds)
    assert not is_state_map(ds.assign_coords(d_model=("run", ds["state_size"].values // 32)))  # the size preset


def _rho_horizon(sign):
    """memory_horizon whose ratio to T_train goes with far/in (sign +1) or against it (-1),
    the within-size order the same as the pooled one."""
    return lambda s, t, seed: (1000.0 / t) ** sign * t * (1 + 0.01 * seed + 1e-4 * s)


@pytest.mark.parametrize(("threshold", "horizon", "expect"), [
    # T_forget grows with the state (32, 64, 256 in every seed): a positive slope, no later rise
    (lambda s, seed: {1024: 32, 4096: 64, 16384: 256}[s], None, ("supported", "not decided")),
    # T_forget falls with the state (256, 64, 32): the slope's interval lies below zero
    (lambda s, seed: {1024: 256, 4096: 64, 16384: 32}[s], None, ("refuted", "not decided")),
    # every threshold censored below (no run rises): the grid brackets nothing
    (lambda s, seed: 0, None, ("not decided", "not decided")),
    # the smallest state never rises (T_forget <= 16), the largest rises at every length (> 256):
    # censored both ways, the medians' intervals do not overlap and increase: not refuted, not fitted
    (lambda s, seed: {1024: 0, 4096: 0, 16384: 10**6}[s], None, ("not decided", "not decided")),
])
def test_the_pre_registered_threshold_verdict(threshold, horizon, expect):
    from dynlab.lm.report.forget import state_verdicts

    got = state_verdicts(_dataset(threshold))
    assert (got["threshold"], got["contraction"]) == expect


def test_the_threshold_is_refuted_when_the_largest_states_median_lies_below_the_smallests():
    """The largest state's T_forget censored below (<= 16) while the smallest's is 64 in every
    seed: the median does not increase (one uncensored size: no slope to fit)."""
    from dynlab.lm.report.forget import forget_fit, state_verdicts

    ds = _dataset(lambda s, seed: {1024: 64, 4096: 0, 16384: 0}[s])
    assert np.isnan(forget_fit(forget_thresholds(forget_grid(ds)))["slope"])
    assert state_verdicts(ds)["threshold"] == "refuted"


@pytest.mark.parametrize(("sign", "expect"), [(1, "supported"), (-1, "refuted")])
def test_the_pre_registered_contraction_verdict(sign, expect):
    """far/in 1.3 at T below 64 and 1.01 from it: a horizon / T_train that falls with T (sign
    +1: 1000 / T) goes with far/in, pooled and within every size."""
    from dynlab.lm.report.forget import state_verdicts

    ds = _dataset(lambda s, seed: 64, horizon=_rho_horizon(sign))
    ds["far_in_ratio"] = ds["far_in_ratio"] + 1e-3 * (1000.0 / ds["train_length"])  # a strict order within the ties
    assert state_verdicts(ds)["contraction"] == expect


def test_a_state_size_that_never_learned_has_no_threshold_and_decides_nothing():
    """Every run of the smallest state diverged: its cells have no T_forget ('none'), it
    is left out of the medians, and the verdict cannot be 'refuted' on its account."""
    from dynlab.lm.report.forget import state_verdicts

    ds = _dataset(lambda s, seed: {1024: 0, 4096: (64, 256, 32)[seed], 16384: 128}[s],
                  status=lambda s, t, seed: "diverged" if s == 1024 else "ok")
    th = forget_thresholds(forget_grid(ds))
    assert th["censored"].sel(state_size=1024).values.tolist() == ["none"] * 3
    assert state_verdicts(ds)["threshold"] == "not decided"


def test_unlearned_runs_bound_a_threshold_instead_of_setting_it():
    """The shortest run did not learn and the next is quiet: T_forget ≤ 32, censored below,
    not 32; every learned run rises but the longest did not learn: T_forget > 128, not > 256."""
    ds = _dataset(lambda s, seed: {1024: 0, 4096: 10**6, 16384: 64}[s],
                  status=lambda s, t, seed: "diverged" if (s == 1024 and t == 16) or (s == 4096 and t == 256) else "ok")
    th = forget_thresholds(forget_grid(ds))
    assert th["censored"].sel(state_size=1024).values.tolist() == ["below"] * 3
    assert (th["bound"].sel(state_size=1024) == 32).all() and np.isnan(th["t_forget"].sel(state_size=1024)).all()
    assert th["censored"].sel(state_size=4096).values.tolist() == ["above"] * 3
    assert (th["bound"].sel(state_size=4096) == 128).all()
    assert (th["t_forget"].sel(state_size=16384) == 64).all()


def test_holm_counts_every_test_of_the_family_even_one_that_could_not_run():
    """Five tests fixed in advance: with one size's test impossible (fewer than 3 learned
    runs) the others are still adjusted over five."""
    ds = _dataset(lambda s, seed: 64, sizes=(1024, 4096, 16384, 65536), horizon=_rho_horizon(1),
                  status=lambda s, t, seed: "diverged" if s == 65536 and (t > 16 or seed > 0) else "ok")
    ds["far_in_ratio"] = ds["far_in_ratio"] + 1e-3 * (1000.0 / ds["train_length"])
    rows = contraction_correlations(forget_grid(ds))
    assert len(rows) == 5 and not np.isfinite(rows[-1]["p"]) and "p_holm" not in rows[-1]
    from dynlab.analysis.contrasts import holm

    expect = holm([r["p"] for r in rows[:4]] + [1.0])[:4]
    assert [r["p_holm"] for r in rows[:4]] == pytest.approx(list(expect))
