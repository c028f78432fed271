"""Correlation between T_cross and max-pass length mp across runs, with bootstrap CIs.

Statistics: Pearson r of (T_cross, mp); Spearman rho = Pearson r of the ranks (ties get
their average rank).  Confidence intervals: percentile bootstrap over runs (pairs resampled
with replacement, ``n_boot`` resamples from an explicit numpy Generator); resamples in which
either variable is constant give no correlation and are left out (counted in
``n_boot_degenerate``).

Censoring rule (stated, and counted in the output):
- T_cross is censored when the run never crossed within its horizon (T_cross is NaN).  With
  ``censoring='replace'`` (default) it is replaced by the horizon (a lower bound on the true
  crossing); ``horizon`` must then be given (scalar or one per run).
- mp is censored when the run passed every evaluated length (``mp_censored`` True, or, when
  only ``max_length`` is given, mp >= max_length).  By construction (SPEC A3) mp already
  equals the largest evaluated length then; with 'replace' it is kept at that value.
- With ``censoring='drop'`` every run with either value censored is left out.
Runs with NaN mp are always left out (counted in ``n_dropped``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import xarray as xr
from scipy.stats import rankdata

__all__ = ["CorrelationResult", "tcross_mp_correlation"]


@dataclass(frozen=True)
class CorrelationResult:
    """Pearson/Spearman correlation between T_cross and mp with bootstrap CIs and censoring counts."""

    pearson_r: float
    pearson_ci: tuple[float, float]
    spearman_rho: float
    spearman_ci: tuple[float, float]
    n_runs: int
    n_used: int
    n_tcross_censored: int
    n_mp_censored: int
    n_both_censored: int
    n_dropped: int
    n_boot: int
    n_boot_degenerate: int
    ci_level: float
    censoring: str

    def to_dataset(self) -> xr.Dataset:
        """The result as a Dataset of scalars (CI bounds as ``*_lo`` / ``*_hi``)."""
        one = {"units": "1"}
        lvl = f"{self.ci_level:g} bootstrap CI"
        vals = {
            "pearson_r": (self.pearson_r, "Pearson r(T_cross, mp)"),
            "pearson_r_lo": (self.pearson_ci[0], f"Pearson r, lower end of {lvl}"),
            "pearson_r_hi": (self.pearson_ci[1], f"Pearson r, upper end of {lvl}"),
            "spearman_rho": (self.spearman_rho, "Spearman rho(T_cross, mp)"),
            "spearman_rho_lo": (self.spearman_ci[0], f"Spearman rho, lower end of {lvl}"),
            "spearman_rho_hi": (self.spearman_ci[1], f"Spearman rho, upper end of {lvl}"),
            "n_runs": (self.n_runs, "runs given"),
            "n_used": (self.n_used, "runs used"),
            "n_tcross_censored": (self.n_tcross_censored, "runs with T_cross censored (never crossed)"),
            "n_mp_censored": (self.n_mp_censored, "runs with mp censored (passed every length)"),
            "n_both_censored": (self.n_both_censored, "runs with both censored"),
            "n_dropped": (self.n_dropped, "runs left out"),
            "n_boot_degenerate": (self.n_boot_degenerate, "bootstrap resamples with a constant variable"),
        }
        return xr.Dataset(
            {k: ((), v, {"long_name": name, **one}) for k, (v, name) in vals.items()},
            attrs={"n_boot": self.n_boot, "ci_level": self.ci_level, "censoring": self.censoring},
        )


def _pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise Pearson r of ``a, b [..., n]`` (NaN where a row is constant)."""
    const = (np.ptp(a, axis=-1) == 0) | (np.ptp(b, axis=-1) == 0)
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.clip((a * b).sum(-1) / den, -1.0, 1.0)
    return np.where(const, np.nan, r)


def tcross_mp_correlation(
    t_cross: Any,
    mp: Any,
    *,
    horizon: Any | None = None,
    mp_censored: Any | None = None,
    max_length: float | None = None,
    censoring: Literal["replace", "drop"] = "replace",
    n_boot: int = 2000,
    ci_level: float = 0.95,
    rng: np.random.Generator,
) -> CorrelationResult:
    """Pearson r and Spearman rho between T_cross and mp across runs (module docstring).

    Args:
        t_cross: ``[R]`` crossing step per run (NaN = never crossed, censored).
        mp: ``[R]`` max-pass length per run.
        horizon: scalar or ``[R]`` evaluation horizon replacing censored T_cross ('replace').
        mp_censored: ``[R]`` bool, mp censored at the largest evaluated length.
        max_length: largest evaluated length; used to flag mp >= max_length as censored when
            ``mp_censored`` is not given.
        censoring: 'replace' or 'drop'.
        n_boot: bootstrap resamples (>= 1).
        ci_level: central probability of the percentile interval, in (0, 1).
        rng: numpy Generator driving the bootstrap.
    """
    if censoring not in ("replace", "drop"):
        raise ValueError(f"censoring={censoring!r}; allowed: 'replace', 'drop'")
    if n_boot < 1:
        raise ValueError(f"n_boot={n_boot}; allowed: an integer >= 1")
    if not 0 < ci_level < 1:
        raise ValueError(f"ci_level={ci_level}; allowed: a float in (0, 1)")
    tc = np.asarray(t_cross, dtype=np.float64).copy()
    mpv = np.asarray(mp, dtype=np.float64).copy()
    if tc.ndim != 1 or mpv.shape != tc.shape:
        raise ValueError(f"t_cross {tc.shape} and mp {mpv.shape}; allowed: both [R]")
    tc_cens = np.isnan(tc)
    if mp_censored is not None:
        mp_cens = np.asarray(mp_censored, dtype=bool)
        if mp_cens.shape != tc.shape:
            raise ValueError(f"mp_censored has shape {mp_cens.shape}; allowed: {tc.shape}")
    elif max_length is not None:
        mp_cens = mpv >= float(max_length)
    else:
        mp_cens = np.zeros(tc.shape, dtype=bool)
    keep = ~np.isnan(mpv)
    if censoring == "drop":
        keep &= ~tc_cens & ~mp_cens
    else:
        if tc_cens.any():
            if horizon is None:
                raise ValueError("T_cross has censored (NaN) runs and horizon=None; allowed: a scalar or [R] horizon")
            hz = np.broadcast_to(np.asarray(horizon, dtype=np.float64), tc.shape)
            tc = np.where(tc_cens, hz, tc)
    n_used = int(keep.sum())
    if n_used < 3:
        raise ValueError(f"{n_used} usable runs; allowed: at least 3")
    a, b = tc[keep], mpv[keep]
    ra, rb = rankdata(a), rankdata(b)
    r = float(_pearson_rows(a, b))
    rho = float(_pearson_rows(ra, rb))

    idx = rng.integers(0, n_used, size=(n_boot, n_used))  # [n_boot, n]
    boot_r = _pearson_rows(a[idx], b[idx])  # [n_boot]
    boot_rho = _pearson_rows(rankdata(a[idx], axis=1), rankdata(b[idx], axis=1))
    degenerate = np.isnan(boot_r) | np.isnan(boot_rho)
    lo_q, hi_q = 100 * (1 - ci_level) / 2, 100 * (1 + ci_level) / 2

    def ci(v: np.ndarray) -> tuple[float, float]:
        v = v[~np.isnan(v)]
        if v.size == 0:
            return float("nan"), float("nan")
        lo, hi = np.percentile(v, [lo_q, hi_q])
        return float(lo), float(hi)

    return CorrelationResult(
        pearson_r=r,
        pearson_ci=ci(boot_r),
        spearman_rho=rho,
        spearman_ci=ci(boot_rho),
        n_runs=int(tc.size),
        n_used=n_used,
        n_tcross_censored=int(tc_cens.sum()),
        n_mp_censored=int(mp_cens.sum()),
        n_both_censored=int((tc_cens & mp_cens).sum()),
        n_dropped=int(tc.size - n_used),
        n_boot=int(n_boot),
        n_boot_degenerate=int(degenerate.sum()),
        ci_level=float(ci_level),
        censoring=censoring,
    )
