"""Paired contrasts of post-training arms against the zero control, against scipy's paired t-test."""

from __future__ import annotations

import numpy as np
import xarray as xr
from scipy import stats

import pytest

from dynlab.analysis.contrasts import arm_order, bootstrap_mean_ci, holm, paired_contrasts, paired_summary


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


def test_holm_by_hand():
    # sorted: 0.005·4 = 0.02, 0.01·3 = 0.03, 0.03·2 = 0.06, 0.04·1 = 0.04 -> kept at the running max 0.06
    np.testing.assert_allclose(holm([0.01, 0.04, 0.03, 0.005]), [0.03, 0.06, 0.06, 0.02])
    # capped at 1; a NaN is no test and does not count in the family (m = 2 here)
    np.testing.assert_allclose(holm([0.6, np.nan, 0.02]), [0.6, np.nan, 0.04])
    np.testing.assert_allclose(holm([[0.5, 0.7]]), [[1.0, 1.0]])
    # R's p.adjust(c(0.01, 0.02, 0.03, 0.04, 0.05), "holm"): 0.05 0.08 0.09 0.09 0.09
    np.testing.assert_allclose(holm([0.01, 0.02, 0.03, 0.04, 0.05]), [0.05, 0.08, 0.09, 0.09, 0.09])
    with pytest.raises(ValueError, match="p-values"):
        holm([0.1, 1.5])


def test_holm_against_an_independent_step_down():
    # the textbook procedure: reject in sorted order while p_(k) <= alpha / (m - k + 1);
    # a hypothesis is rejected at alpha exactly when its adjusted p is <= alpha
    rng = np.random.default_rng(3)
    for _ in range(50):
        p = rng.random(8) ** 3
        adjusted = holm(p)
        for alpha in (0.01, 0.05, 0.2):
            rejected = np.zeros(8, bool)
            for k, i in enumerate(np.argsort(p)):
                if p[i] > alpha / (8 - k):
                    break
                rejected[i] = True
            assert np.array_equal(adjusted <= alpha, rejected)
        assert np.all(adjusted >= p) and np.all(adjusted <= np.minimum(1, 8 * p) + 1e-15)


def test_bootstrap_interval_is_scipys_and_covers_the_mean():
    d = np.array([-0.46, -0.49, -0.10, -0.34, -0.43])
    lo, hi = bootstrap_mean_ci(d, seed=1)
    res = stats.bootstrap((d,), np.mean, method="percentile", rng=np.random.default_rng(1))
    assert (lo, hi) == (res.confidence_interval.low, res.confidence_interval.high)
    assert d.min() <= lo < d.mean() < hi <= d.max()
    assert np.isnan(bootstrap_mean_ci(np.array([1.0]))).all()  # one pair: no interval
    assert bootstrap_mean_ci(np.array([0.3, 0.3, 0.3])) == (0.3, 0.3)


def _arms_dataset(values: dict[str, list[float]]) -> xr.Dataset:
    rows = [(arm, seed, v) for arm, vs in values.items() for seed, v in enumerate(vs)]
    return xr.Dataset({"ppl_far": ("run", [r[2] for r in rows]), "status": ("run", ["ok"] * len(rows))},
                      coords={"arch": ("run", ["mamba2"] * len(rows)), "intervention": ("run", [r[0] for r in rows]),
                              "seed": ("run", [r[1] for r in rows]), "phase": ("run", ["post"] * len(rows))})


def test_arm_order_ranks_by_the_mean_contrast_and_tests_every_pair():
    values = {"zero": [6.0, 6.5, 5.8, 6.2, 6.1], "a": [5.9, 6.4, 5.8, 6.0, 6.1],
              "b": [5.5, 6.1, 5.6, 5.7, 5.4], "c": [5.6, 6.0, 5.3, 5.9, 5.7]}
    out = arm_order(_arms_dataset(values))
    z = np.array(values["zero"])
    assert [r["arm"] for r in out["arms"]] == ["b", "c", "a"]  # mean contrasts -0.42, -0.42 + ..., -0.08
    for r in out["arms"]:
        d = np.array(values[r["arm"]]) - z
        assert r["mean"] == pytest.approx(d.mean()) and r["n"] == 5
        assert (r["lo"], r["hi"]) == bootstrap_mean_ci(d)
    assert [(x["a"], x["b"]) for x in out["pairs"]] == [("b", "c"), ("b", "a"), ("c", "a")]
    raw = [stats.ttest_rel(values[x["a"]], values[x["b"]]).pvalue for x in out["pairs"]]
    np.testing.assert_allclose([x["p"] for x in out["pairs"]], raw)
    np.testing.assert_allclose([x["p_holm"] for x in out["pairs"]], holm(raw))
    assert out["pairs"][1]["mean"] == pytest.approx(np.mean(np.subtract(values["b"], values["a"])))
