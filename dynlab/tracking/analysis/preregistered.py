"""The pre-registered horizon forecast of mp, and how it is scored on unseen seeds.

Definition (frozen; docs/error-control.md, "Pre-registered horizon forecast"):

    T_prereg = min(T_horizon, T_forecast_dec)

per run, NaN only when both are NaN (a forecast that is NaN never fired within the
horizon, so the other one decides).  Both parts read sequences no longer than the training
length t_ref only:

- ``T_horizon`` (:mod:`dynlab.tracking.analysis.horizon`): the decoder margins and spreads drifting
  linearly on [⌈t_ref/2⌉, t_ref], Gaussian error model, first step with predicted accuracy
  below 0.9;
- ``T_forecast_dec`` (:mod:`dynlab.tracking.analysis.spec`): q_dec fitted by a straight line on
  the same window and extrapolated to τ = 0.5.

Each is the observed failure when that lies inside the training length.  The earlier of
two forecasts fires on whichever failure comes first: a class drifting towards a decoder
boundary, or the decoder ratio growing.

Score (:func:`preregistered_scores`): over the ``ok`` runs of the given seeds, Pearson r
and Spearman ρ of (T_prereg, mp) with 95 % percentile-bootstrap CIs (2000 resamples,
``numpy.random.default_rng(0)``), under the censoring rules 'drop' (the headline) and
'replace' (:func:`dynlab.analysis.correlation.tcross_mp_correlation`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import xarray as xr

from dynlab.analysis.correlation import tcross_mp_correlation

__all__ = ["PREREGISTERED_DEFINITION", "preregistered_forecast", "preregistered_scores"]

#: The definition, as written in docs/error-control.md.
PREREGISTERED_DEFINITION = "T_prereg = min(T_horizon, T_forecast_dec)"

_PARTS = ("T_horizon", "T_forecast_dec")


def preregistered_forecast(ds: xr.Dataset) -> xr.DataArray:
    """``T_prereg(run)`` of a group-tracking study dataset (module docstring)."""
    absent = [v for v in _PARTS if v not in ds]
    if absent:
        raise ValueError(f"the pre-registered forecast needs {', '.join(absent)} (absent from the dataset)")
    out = xr.DataArray(np.fmin(ds["T_horizon"].values.astype(np.float64), ds["T_forecast_dec"].values.astype(np.float64)),
                       dims=("run",), coords=ds["T_horizon"].coords, name="T_prereg")
    out.attrs.update(long_name="pre-registered horizon forecast", units="tokens", definition=PREREGISTERED_DEFINITION)
    return out


def preregistered_scores(ds: xr.Dataset, seeds: Sequence[int] | None = None, *, n_boot: int = 2000) -> dict[str, Any]:
    """Pearson r and Spearman ρ of (T_prereg, mp) with bootstrap CIs under 'drop' and
    'replace', over the ``ok`` runs of ``seeds`` (default all) of ``ds``.

    Returns ``{censoring: {"r", "r_ci", "rho", "rho_ci", "n"}}`` plus ``"seeds"`` and
    ``"definition"``.
    """
    keep = (ds["status"].values == "ok") & np.isfinite(ds["mp"].values)
    if seeds is not None:
        keep &= np.isin(ds["seed"].values, np.asarray(list(seeds)))
    d = ds.isel(run=np.flatnonzero(keep))
    t = preregistered_forecast(d).values
    out: dict[str, Any] = {"definition": PREREGISTERED_DEFINITION,
                           "seeds": sorted({int(s) for s in d["seed"].values})}
    for cens in ("drop", "replace"):
        r = tcross_mp_correlation(t, d["mp"].values, horizon=d["horizon"].values, mp_censored=d["mp_censored"].values,
                                  censoring=cens, n_boot=n_boot, rng=np.random.default_rng(0))
        out[cens] = {"r": r.pearson_r, "r_ci": r.pearson_ci, "rho": r.spearman_rho, "rho_ci": r.spearman_ci,
                     "n": r.n_used}
    return out
