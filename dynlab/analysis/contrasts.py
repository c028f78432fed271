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
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import xarray as xr
from scipy import stats

__all__ = ["paired_contrasts", "paired_summary"]


def paired_summary(diffs: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Mean, 95 % t-interval and paired-t p-value of ``diffs [n, ...]`` along axis 0.

    Returns ``(mean, lo, hi, p)``, each of shape ``diffs.shape[1:]`` (see the module docstring).
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
    sd = d.std(axis=0, ddof=1)
    half = stats.t.ppf(0.975, n - 1) * sd / np.sqrt(n)
    with np.errstate(divide="ignore", invalid="ignore"):
        t = mean / (sd / np.sqrt(n))
        p = np.where(sd > 0, 2 * stats.t.sf(np.abs(t), n - 1), np.nan)
    return mean, mean - half, mean + half, p


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
