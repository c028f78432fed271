"""Paired contrasts between training arms over seeds: intervention minus the zero-state control.

Each contrast pairs an arm with the control of the *same* trained model (the same stored
run, ``run_id``; same architecture and seed where there is no ``run_id``), so the seed-to-seed spread of the trained models cancels. For a
metric ``m`` and arm ``a``, per pair i the difference is ``d_i = m_a,i − m_zero,i``; over
the n pairs:

- ``contrast_mean`` = mean(d), in the metric's units;
- ``contrast_lo``, ``contrast_hi`` = the two-sided 95 % Student-t interval
  mean(d) ± t_{0.975, n−1} · sd(d) / √n (NaN for n < 2; zero width when every d is equal);
- ``contrast_p`` = the two-sided p-value of the paired t-test (scipy's ``ttest_rel``;
  NaN for n < 2 or when every d is equal);
- ``contrast_n`` = the number of pairs n.

Only rows whose ``status`` is ``ok`` enter (a model that learned nothing proves nothing).

Over a family of tests (every arm × metric, or every pair of arms) :func:`holm` gives Holm's
step-down adjusted p-values; :func:`arm_order` ranks the arms by their mean contrast, each
with a percentile bootstrap interval over seeds (:func:`bootstrap_mean_ci`, scipy's
``bootstrap``), and tests every pair of arms against each other (paired t-test of arm a −
arm b over seeds, Holm over the pairs).
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

import numpy as np
import xarray as xr
from scipy import stats

__all__ = ["arm_order", "bootstrap_mean_ci", "holm", "paired_contrasts", "paired_summary"]


def paired_summary(diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, 95 % t-interval and paired-t p-value of ``diffs [n, ...]`` along axis 0
    (``scipy.stats.ttest_rel`` of the pairs, i.e. of the differences against 0).

    Returns ``(mean, lo, hi, p)``, each of shape ``diffs.shape[1:]`` (see the module
    docstring): where every difference is equal (sd 0) the interval has zero width and p is
    NaN, as scipy would give no finite t there.
    """
    d = np.asarray(diffs, dtype=float)
    n = d.shape[0]
    if n == 0:
        nan = np.full(d.shape[1:], np.nan)
        return nan, nan, nan, nan
    mean = d.mean(axis=0)
    if n < 2:
        nan = np.full(d.shape[1:], np.nan)
        return mean, nan, nan, nan
    flat = d.reshape(n, -1)
    spread = flat.std(axis=0, ddof=1) > 0  # NaN (a missing difference) is no spread: its mean, NaN, throughout
    lo, hi = flat.mean(axis=0), flat.mean(axis=0)  # zero width where there is no spread
    p = np.full(flat.shape[1], np.nan)
    if spread.any():
        with warnings.catch_warnings():  # differences equal but for rounding: the t-test as written, no notice
            warnings.filterwarnings("ignore", "Precision loss occurred in moment calculation", RuntimeWarning)
            res = stats.ttest_rel(flat[:, spread], np.zeros_like(flat[:, spread]), axis=0)
            ci = res.confidence_interval(0.95)
        lo[spread], hi[spread], p[spread] = ci.low, ci.high, res.pvalue
    shape = d.shape[1:]
    return mean, lo.reshape(shape), hi.reshape(shape), p.reshape(shape)


def paired_contrasts(ds: xr.Dataset, variable: str = "accuracy", control: str = "zero",
                     arms: Sequence[str] | None = None) -> xr.Dataset:
    """Paired contrasts of ``variable`` (dim ``run`` plus any others) between each arm and ``control``.

    ``ds`` has on ``run`` the coords ``arch``, ``seed``, ``intervention`` and ``phase``
    (only ``phase == "post"`` rows are used) and a ``status`` variable. Returns a dataset
    with ``contrast_mean``, ``contrast_lo``, ``contrast_hi``, ``contrast_p`` on
    ``(arch, contrast, ...)`` and ``contrast_n`` on ``(arch, contrast)``; ``contrast``
    names the arm. Empty (no variables) when no row is a post-training arm.
    """
    post = ds.isel(run=np.flatnonzero((ds["phase"].values.astype(str) == "post")
                                      & (ds["status"].values.astype(str) == "ok")))
    ivs = post["intervention"].values.astype(str)
    names = [a for a in (arms if arms is not None else dict.fromkeys(ivs)) if a != control]
    if post.sizes["run"] == 0 or not names:
        return xr.Dataset()
    archs = list(dict.fromkeys(post["arch"].values.astype(str)))
    other = [d for d in post[variable].dims if d != "run"]
    shape = [post.sizes[d] for d in other]
    out = {k: np.full((len(archs), len(names), *shape), np.nan) for k in ("mean", "lo", "hi", "p")}
    count = np.zeros((len(archs), len(names)), dtype=np.int64)
    values = post[variable].transpose("run", *other).values
    arch_of = post["arch"].values.astype(str)
    # an arm's control is the one post-trained from the same trained model: same stored run
    # (run_id) where the dataset has it, else same (arch, seed)
    model_of = post["run_id"].values.astype(str) if "run_id" in post.coords else post["seed"].values
    for i, arch in enumerate(archs):
        for j, arm in enumerate(names):
            diffs = []
            for r in np.flatnonzero((arch_of == arch) & (ivs == arm)):
                ctrl = np.flatnonzero((arch_of == arch) & (ivs == control) & (model_of == model_of[r]))
                if len(ctrl):
                    diffs.append(values[r] - values[ctrl[0]])
            count[i, j] = len(diffs)
            res = paired_summary(np.asarray(diffs).reshape(len(diffs), *shape))
            for key, val in zip(("mean", "lo", "hi", "p"), res):
                out[key][i, j] = val
    dims = ("mixer", "contrast", *other)
    coords = {"mixer": archs, "contrast": names, **{d: post[d].values for d in other}}
    data = {f"contrast_{k}": (dims, v) for k, v in out.items()}
    data["contrast_n"] = (("mixer", "contrast"), count)
    return xr.Dataset(data, coords=coords, attrs={"contrast_variable": variable, "contrast_control": control})


def holm(pvalues) -> np.ndarray:
    """Holm's step-down adjusted p-values of a family of tests, in the input's order and shape.

    With the m finite p-values sorted, p_(1) ≤ … ≤ p_(m), the adjusted value of p_(k) is
    max over j ≤ k of min(1, (m − j + 1) · p_(j)). NaN p-values (no test) stay NaN and do
    not count in m. Rejecting where the adjusted p is below α keeps the family-wise error
    rate at α.
    """
    p = np.asarray(pvalues, dtype=float)
    flat = p.ravel()
    out = np.full(flat.shape, np.nan)
    finite = np.flatnonzero(np.isfinite(flat))
    if finite.size:
        if np.any((flat[finite] < 0) | (flat[finite] > 1)):
            raise ValueError(f"p-values must lie in [0, 1], got {flat[finite].min()} to {flat[finite].max()}")
        order = finite[np.argsort(flat[finite], kind="stable")]
        m = order.size
        steps = np.minimum(1.0, (m - np.arange(m)) * flat[order])
        out[order] = np.maximum.accumulate(steps)
    return out.reshape(p.shape)


def bootstrap_mean_ci(diffs, level: float = 0.95, n_resamples: int = 9999, seed: int = 0) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of paired differences ``diffs [n]``
    (scipy.stats.bootstrap, the pairs resampled with replacement, an explicit seed);
    ``(nan, nan)`` for n < 2, ``(d, d)`` when every difference is d."""
    d = np.asarray(diffs, dtype=float)
    if d.size < 2:
        return np.nan, np.nan
    if np.all(d == d[0]):
        return float(d[0]), float(d[0])
    res = stats.bootstrap((d,), np.mean, n_resamples=n_resamples, confidence_level=level, method="percentile",
                          rng=np.random.default_rng(seed))
    return float(res.confidence_interval.low), float(res.confidence_interval.high)


def arm_order(ds: xr.Dataset, variable: str = "ppl_far", control: str = "zero", arms: Sequence[str] | None = None,
              level: float = 0.95, seed: int = 0) -> dict:
    """The arms of ``ds`` (a dataset :func:`paired_contrasts` reads, one architecture) ranked by
    their mean contrast of the scalar ``variable`` against ``control``, lowest first, and every
    pair of arms tested against each other.

    Returns ``{"arms": [{"arm", "mean", "lo", "hi", "n"}], "pairs": [{"a", "b", "mean", "lo",
    "hi", "p", "p_holm", "n"}]}``: per arm its mean paired difference from the control with a
    percentile bootstrap interval over seeds (:func:`bootstrap_mean_ci`); per pair (a ranked
    before b) the mean of a − b over the seeds where both finished, its bootstrap interval,
    the paired t-test's p and Holm's p over all the pairs (:func:`holm`).
    """
    archs = list(dict.fromkeys(ds["arch"].values.astype(str)))
    if len(archs) != 1:
        raise ValueError(f"arm_order needs one architecture, got {archs}")
    post = ds.isel(run=np.flatnonzero((ds["phase"].values.astype(str) == "post")
                                      & (ds["status"].values.astype(str) == "ok")))
    ivs = post["intervention"].values.astype(str)
    names = [a for a in (arms if arms is not None else dict.fromkeys(ivs)) if a != control]
    model_of = post["run_id"].values.astype(str) if "run_id" in post.coords else post["seed"].values.astype(str)
    value = {(iv, m): float(v) for iv, m, v in zip(ivs, model_of, post[variable].values)}
    models = list(dict.fromkeys(model_of))

    def diffs(a: str, b: str) -> np.ndarray:
        return np.array([value[(a, m)] - value[(b, m)] for m in models if (a, m) in value and (b, m) in value])

    ranked = []
    for arm in names:
        d = diffs(arm, control)
        lo, hi = bootstrap_mean_ci(d, level, seed=seed)
        ranked.append({"arm": arm, "mean": float(d.mean()) if d.size else np.nan, "lo": lo, "hi": hi, "n": int(d.size)})
    ranked.sort(key=lambda r: (not np.isfinite(r["mean"]), r["mean"]))
    pairs = []
    for i, first in enumerate(ranked):
        for second in ranked[i + 1:]:
            d = diffs(first["arm"], second["arm"])
            mean, _, _, p = paired_summary(d)
            lo, hi = bootstrap_mean_ci(d, level, seed=seed)
            pairs.append({"a": first["arm"], "b": second["arm"], "mean": float(mean), "lo": lo, "hi": hi,
                          "p": float(p), "n": int(d.size)})
    for pair, adjusted in zip(pairs, holm([x["p"] for x in pairs])):
        pair["p_holm"] = float(adjusted)
    return {"arms": ranked, "pairs": pairs}
