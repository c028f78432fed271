"""Does the geometry at the fixed points predict error control?  Correlations across runs.

Per run of a group-tracking study dataset (the ``fp_*`` variables of
:func:`dynlab.tracking.analysis.fixed_points.per_state.tracker_fixed_points`, dim ``state``):

- ``rho_perp``, ``rho_par``: the median over the run's symbolic states of ``fp_rho_perp``
  and ``fp_rho_par`` (spectral radius per token on U⊥ and on U at the fixed points);
- ``par_dev`` = |ρ∥ − 1|: how far the return map is from neutral along U (Theorem 1: an
  affine tracker that preserves every state has ρ∥ = 1);
- ``found``: every state's residual ``fp_residual`` is at most ``tol`` (1e-8).

Over the ``ok`` runs (finite mp), :func:`mechanism_correlations` gives Pearson r and
Spearman ρ with 95 % percentile-bootstrap CIs (2000 resamples, ``default_rng(0)``;
:func:`dynlab.analysis.correlation.tcross_mp_correlation`) of:

- log ρ⊥ against the recovery rate along U⊥, and log ρ∥ against the recovery rate along U
  (a map that scales a direction by λ per step recovers at log λ per step, so the two agree
  exactly for a tracker that sits at its fixed points);
- ρ⊥ and |ρ∥ − 1| against mp, under 'replace' (a censored mp kept at the longest length)
  and 'drop' (censored mp left out);

and, per failure mode of ``failure_mode_dec`` (robust, climb, saturation), the runs and
the medians of ρ⊥ and |ρ∥ − 1|.  Runs whose value is NaN (no fixed point found) are left
out of each statistic that reads it.

Corollary 1 from the return maps (:func:`corollary1_correlations`, the run variables
``fp_drift`` and ``T_cross_fp`` of :mod:`dynlab.tracking.analysis.fixed_points.drift`): over the same ``ok``
runs, r and ρ with the same CIs of the predicted crossing ``T_cross_fp`` against the
measured crossing of q∥ (``T_cross_par``, the one it predicts), against the trained
decoder's crossing ``T_cross_dec`` and against mp, each under 'replace' (a crossing that
never happened, on either side, set to the run's horizon; a censored mp kept) and 'drop'
(runs with either side censored left out).
"""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import xarray as xr

from dynlab.analysis.correlation import tcross_mp_correlation

__all__ = ["corollary1_correlations", "mechanism_correlations", "run_fixed_point_summary"]


def run_fixed_point_summary(ds: xr.Dataset, tol: float = 1e-8) -> xr.Dataset:
    """``rho_perp``, ``rho_par``, ``par_dev`` and ``found`` per run (module docstring)."""
    absent = [v for v in ("fp_rho_perp", "fp_rho_par", "fp_residual") if v not in ds]
    if absent:
        raise ValueError(f"the fixed-point summary needs {', '.join(absent)} (absent from the dataset)")
    with np.errstate(invalid="ignore"), warnings.catch_warnings():
        warnings.simplefilter("ignore", RuntimeWarning)  # all-NaN runs give NaN
        rho_perp = np.nanmedian(ds["fp_rho_perp"].transpose("run", "state").values, axis=1)
        rho_par = np.nanmedian(ds["fp_rho_par"].transpose("run", "state").values, axis=1)
    res = ds["fp_residual"].transpose("run", "state").values
    present = np.isfinite(res)
    found = present.any(1) & np.all(~present | (res <= tol), axis=1)
    return xr.Dataset({"rho_perp": ("run", rho_perp), "rho_par": ("run", rho_par),
                       "par_dev": ("run", np.abs(rho_par - 1.0)), "found": ("run", found)},
                      coords={"run": ds["run"].values})


def _corr(x: np.ndarray, y: np.ndarray, mp_censored: np.ndarray | None, censoring: str) -> dict[str, Any]:
    keep = np.isfinite(x) & np.isfinite(y)
    if keep.sum() < 3:
        return {"r": float("nan"), "r_ci": (float("nan"),) * 2, "rho": float("nan"), "rho_ci": (float("nan"),) * 2,
                "n": int(keep.sum())}
    cens = None if mp_censored is None else mp_censored[keep]
    try:
        c = tcross_mp_correlation(x[keep], y[keep], mp_censored=cens, censoring=censoring, rng=np.random.default_rng(0))
    except ValueError:  # fewer than 3 runs left after dropping censored mp
        return {"r": float("nan"), "r_ci": (float("nan"),) * 2, "rho": float("nan"), "rho_ci": (float("nan"),) * 2,
                "n": 0}
    return {"r": c.pearson_r, "r_ci": c.pearson_ci, "rho": c.spearman_rho, "rho_ci": c.spearman_ci, "n": c.n_used}


def _pair_correlations(s: xr.Dataset, d: xr.Dataset) -> dict[str, Any]:
    """The correlations of the module docstring over the runs of ``d`` (summary ``s``)."""
    rate = d["recovery_rate"]
    with np.errstate(divide="ignore", invalid="ignore"):
        log_perp, log_par = np.log(s["rho_perp"].values), np.log(s["rho_par"].values)
    mp, cens = d["mp"].values.astype(np.float64), d["mp_censored"].values.astype(bool)
    out: dict[str, Any] = {
        "recovery_perp": _corr(log_perp, rate.sel(direction="U_perp").values, None, "replace"),
        "recovery_par": _corr(log_par, rate.sel(direction="U").values, None, "replace"),
    }
    for name, x in (("rho_perp", s["rho_perp"].values), ("par_dev", s["par_dev"].values)):
        for rule in ("replace", "drop"):
            out[f"mp_{name}_{rule}"] = _corr(x, mp, cens, rule)
    return out


def _failure_modes(s: xr.Dataset, d: xr.Dataset) -> dict[str, dict[str, Any]]:
    """Per failure mode of ``failure_mode_dec``: the runs and the medians of ρ⊥ and |ρ∥ − 1|."""
    modes = d["failure_mode_dec"].values.astype(str)
    out = {}
    for mode in ("robust", "climb", "saturation"):
        sel = modes == mode
        with np.errstate(invalid="ignore"), warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            out[mode] = {"n": int(sel.sum()),
                         "rho_perp": float(np.nanmedian(s["rho_perp"].values[sel])) if sel.any() else float("nan"),
                         "par_dev": float(np.nanmedian(s["par_dev"].values[sel])) if sel.any() else float("nan")}
    return out


def mechanism_correlations(ds: xr.Dataset, tol: float = 1e-8) -> dict[str, Any]:
    """The statistics of the module docstring over the ``ok`` runs of ``ds``.

    With a ``family`` variable, also ``by_family``: ``{family: the same correlations over
    that family's ok runs alone}`` (affine, state-dependent), and ``censored_families``: the
    families whose every ok run has a censored mp.  When one is, a pooled r against mp under
    'replace' mostly measures the split between the families (that family sits at the
    longest length), and under 'drop' it is the other family's r."""
    ok = (ds["status"].values == "ok") & np.isfinite(ds["mp"].values)
    d = ds.isel(run=np.flatnonzero(ok))
    s = run_fixed_point_summary(d, tol)
    out: dict[str, Any] = {"n_ok": int(ok.sum()), "found": int(s["found"].sum()), **_pair_correlations(s, d)}
    if "failure_mode_dec" in d:
        out["modes"] = _failure_modes(s, d)
    if "family" in d.coords or "family" in d:
        fam = d["family"].values.astype(str)
        sd = fam == "state-dependent"
        out["state_dependent"] = {"n": int(sd.sum()), "found": int((s["found"].values & sd).sum())}
        cens = d["mp_censored"].values.astype(bool)
        out["by_family"] = {}
        out["censored_families"] = []
        for family in ("affine", "state-dependent"):
            sel = np.flatnonzero(fam == family)
            out["by_family"][family] = {"n_ok": int(sel.size), **_pair_correlations(s.isel(run=sel), d.isel(run=sel))}
            if sel.size and cens[sel].all():
                out["censored_families"].append(family)
    return out


def _corr_t(x: np.ndarray, y: np.ndarray, y_censored: np.ndarray, horizon: np.ndarray, censoring: str) -> dict[str, Any]:
    """r and ρ of a crossing time ``x`` (NaN = never) against ``y`` (censored where flagged)."""
    try:
        c = tcross_mp_correlation(x, y, horizon=horizon, mp_censored=y_censored, censoring=censoring,
                                  rng=np.random.default_rng(0))
    except ValueError:  # fewer than 3 usable runs
        return {"r": float("nan"), "r_ci": (float("nan"),) * 2, "rho": float("nan"), "rho_ci": (float("nan"),) * 2,
                "n": 0}
    return {"r": c.pearson_r, "r_ci": c.pearson_ci, "rho": c.spearman_rho, "rho_ci": c.spearman_ci, "n": c.n_used}


def corollary1_correlations(ds: xr.Dataset) -> dict[str, Any]:
    """Corollary 1's predicted crossing ``T_cross_fp`` against the measured ``T_cross_par``,
    ``T_cross_dec`` and mp over the ``ok`` runs of ``ds`` (module docstring).  Returns
    ``{"n_ok", "predicted": runs with a finite T_cross_fp, "<target>_<censoring>": {r, r_ci, rho,
    rho_ci, n}}`` for target in par, dec, mp."""
    absent = [v for v in ("T_cross_fp", "T_cross_par", "T_cross_dec") if v not in ds]
    if absent:
        raise ValueError(f"the Corollary-1 correlations need {', '.join(absent)} (absent from the dataset)")
    ok = (ds["status"].values == "ok") & np.isfinite(ds["mp"].values)
    d = ds.isel(run=np.flatnonzero(ok))
    x = d["T_cross_fp"].values.astype(np.float64)
    horizon = d["horizon"].values.astype(np.float64)
    out: dict[str, Any] = {"n_ok": int(ok.sum()), "predicted": int(np.isfinite(x).sum())}
    for name in ("par", "dec"):
        t = d[f"T_cross_{name}"].values.astype(np.float64)
        cens = ~np.isfinite(t)
        for rule in ("replace", "drop"):
            out[f"{name}_{rule}"] = _corr_t(x, np.where(cens, horizon, t), cens, horizon, rule)
    mp, mp_cens = d["mp"].values.astype(np.float64), d["mp_censored"].values.astype(bool)
    for rule in ("replace", "drop"):
        out[f"mp_{rule}"] = _corr_t(x, mp, mp_cens, horizon, rule)
    return out
