"""Correlation between T_cross and max-pass length mp across runs, with bootstrap CIs.

Statistics: Pearson r of (T_cross, mp); Spearman rho = Pearson r of the ranks (ties get
their average rank).  Confidence intervals: percentile bootstrap over runs (pairs resampled
with replacement, ``n_boot`` resamples from an explicit numpy Generator); resamples in which
either variable is constant give no correlation and are left out (counted in
``n_boot_degenerate``).

The bootstrap is written here, not taken from ``scipy.stats.pearsonr(...).confidence_interval``
(tests/analysis/test_stats_libraries.py shows the two agree, to rounding, on the same Generator when
no resample is degenerate): scipy's interval is NaN as soon as one resample repeats a single
value, which a study of a few runs meets often, whereas here such resamples are left out and
counted, and Spearman's interval uses the very same resamples (scipy has none for rho).

Censoring rule (stated, and counted in the output):
- T_cross is censored when the run never crossed within its horizon (T_cross is NaN).  With
  ``censoring='replace'`` (default) it is replaced by the horizon (a lower bound on the true
  crossing); ``horizon`` must then be given (scalar or one per run).
- mp is censored when the run passed every evaluated length (``mp_censored`` True, or, when
  only ``max_length`` is given, mp >= max_length).  By construction (:mod:`dynlab.tracking.evaluate`) mp already
  equals the largest evaluated length then; with 'replace' it is kept at that value.
- With ``censoring='drop'`` every run with either value censored is left out.
Runs with NaN mp are always left out (counted in ``n_dropped``).

Long module: the statistic, its bootstrap and the censoring rule above are one definition that
the held-out choice, the held-out forecasts and the study-level table apply as written; kept
together, a change to the rule reaches every one of them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
import xarray as xr
from scipy.stats import rankdata

from dynlab.results.vocabulary import annotate

__all__ = [
    "CROSSING_VARIANTS",
    "FORECAST_VARIANTS",
    "PRIOR_DEFAULT_VARIANT",
    "CorrelationResult",
    "correlation_table",
    "format_correlation_report",
    "heldout_choice",
    "heldout_forecasts",
    "study_correlations",
    "tcross_mp_correlation",
]


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
        vals = {
            "pearson_r": self.pearson_r,
            "pearson_r_lo": self.pearson_ci[0],
            "pearson_r_hi": self.pearson_ci[1],
            "spearman_rho": self.spearman_rho,
            "spearman_rho_lo": self.spearman_ci[0],
            "spearman_rho_hi": self.spearman_ci[1],
            "n_runs": self.n_runs,
            "n_used": self.n_used,
            "n_tcross_censored": self.n_tcross_censored,
            "n_mp_censored": self.n_mp_censored,
            "n_both_censored": self.n_both_censored,
            "n_dropped": self.n_dropped,
            "n_boot_degenerate": self.n_boot_degenerate,
        }
        return annotate(xr.Dataset(
            {k: ((), v) for k, v in vals.items()},
            attrs={"n_boot": self.n_boot, "ci_level": self.ci_level, "censoring": self.censoring},
        ))


def _pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Row-wise Pearson r of ``a, b [..., n]`` (NaN where a row is constant)."""
    const = (np.ptp(a, axis=-1) == 0) | (np.ptp(b, axis=-1) == 0)
    a = a - a.mean(-1, keepdims=True)
    b = b - b.mean(-1, keepdims=True)
    den = np.sqrt((a * a).sum(-1) * (b * b).sum(-1))
    with np.errstate(invalid="ignore", divide="ignore"):
        r = np.clip((a * b).sum(-1) / den, -1.0, 1.0)
    return np.where(const, np.nan, r)


def _censored_pairs(
    t_cross: Any, mp: Any, horizon: Any | None, mp_censored: Any | None, max_length: float | None, censoring: str
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """``(tc, mp, tc_censored, mp_censored, keep)`` per run ``[R]`` under the censoring rule
    of the module docstring: ``tc`` with censored crossings replaced by the horizon
    ('replace'), ``keep`` the runs that enter the statistics."""
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
    elif tc_cens.any():
        if horizon is None:
            raise ValueError("T_cross has censored (NaN) runs and horizon=None; allowed: a scalar or [R] horizon")
        tc = np.where(tc_cens, np.broadcast_to(np.asarray(horizon, dtype=np.float64), tc.shape), tc)
    return tc, mpv, tc_cens, mp_cens, keep


def _percentile_ci(v: np.ndarray, ci_level: float) -> tuple[float, float]:
    """Central ``ci_level`` percentile interval of the non-NaN values of ``v`` (NaN, NaN if none)."""
    v = v[~np.isnan(v)]
    if v.size == 0:
        return float("nan"), float("nan")
    lo, hi = np.percentile(v, [100 * (1 - ci_level) / 2, 100 * (1 + ci_level) / 2])
    return float(lo), float(hi)


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
    tc, mpv, tc_cens, mp_cens, keep = _censored_pairs(t_cross, mp, horizon, mp_censored, max_length, censoring)
    n_used = int(keep.sum())
    if n_used < 3:
        raise ValueError(f"{n_used} usable runs; allowed: at least 3")
    a, b = tc[keep], mpv[keep]
    idx = rng.integers(0, n_used, size=(n_boot, n_used))  # [n_boot, n]
    boot_r = _pearson_rows(a[idx], b[idx])  # [n_boot]
    boot_rho = _pearson_rows(rankdata(a[idx], axis=1), rankdata(b[idx], axis=1))
    return CorrelationResult(
        pearson_r=float(_pearson_rows(a, b)),
        pearson_ci=_percentile_ci(boot_r, ci_level),
        spearman_rho=float(_pearson_rows(rankdata(a), rankdata(b))),
        spearman_ci=_percentile_ci(boot_rho, ci_level),
        n_runs=int(tc.size),
        n_used=n_used,
        n_tcross_censored=int(tc_cens.sum()),
        n_mp_censored=int(mp_cens.sum()),
        n_both_censored=int((tc_cens & mp_cens).sum()),
        n_dropped=int(tc.size - n_used),
        n_boot=int(n_boot),
        n_boot_degenerate=int((np.isnan(boot_r) | np.isnan(boot_rho)).sum()),
        ci_level=float(ci_level),
        censoring=censoring,
    )


#: Crossing-time variants of the T_cross–mp report: name -> (dataset variable, what it is).
CROSSING_VARIANTS: dict[str, tuple[str, str]] = {
    "q": ("T_cross", "literal q = R/M on the state (paper A's definition)"),
    "q_par": ("T_cross_par", "q_par = R_par/M on the state"),
    "q_pair": ("T_cross_pair", "worst-pair projected ratio, nearest-centroid decoder, state"),
    "q_pair_out": ("T_cross_pair_out", "worst-pair projected ratio, nearest-centroid decoder, readout features"),
    "q_dec": ("T_cross_dec", "trained-decoder ratio (boundary normals), readout features"),
    "q_pair_ref": ("T_cross_pair_ref", "q_pair with separations held at the training length"),
    "q_dec_ref": ("T_cross_dec_ref", "q_dec with margins held at the training length"),
    "probe": ("T_probe", "linear probe fitted at the training length, accuracy < 0.9"),
}

#: Forecasts (Corollary 1 fitted inside the training length), reported beside the crossings.
FORECAST_VARIANTS: dict[str, tuple[str, str]] = {
    "forecast_pair": ("T_forecast_pair", "linear forecast of q_pair from steps inside the training length"),
    "forecast_pair_out": ("T_forecast_pair_out", "linear forecast of q_pair_out from steps inside the training length"),
    "forecast_dec": ("T_forecast_dec", "linear forecast of q_dec from steps inside the training length"),
    "forecast_horizon": ("T_horizon", "decoder-margin drift forecast of accuracy < 0.9 from steps inside the training length"),
}

#: Default variant when no held-out choice can be made (fewer than two seeds): the trained
#: decoder's ratio, chosen before any data (paper A speaks of the trained decoder's threshold).
PRIOR_DEFAULT_VARIANT = "q_dec"


def correlation_table(
    t_cross: dict[str, Any],
    mp: Any,
    *,
    horizon: Any,
    mp_censored: Any,
    n_boot: int = 2000,
    seed: int = 0,
) -> xr.Dataset:
    """T_cross–mp statistics of several crossing-time variants under both censoring rules.

    Args:
        t_cross: variant name -> ``[R]`` crossing steps (NaN = censored at the run's horizon).
        mp: ``[R]`` max-pass lengths; horizon: ``[R]`` per-run horizon (each censored
            crossing is replaced by its own run's horizon under 'replace');
            mp_censored: ``[R]`` bool.

    Returns:
        Dataset over dims ``variant`` and ``censoring`` ('replace', 'drop') with
        ``corr_r, corr_r_lo, corr_r_hi, corr_rho, corr_rho_lo, corr_rho_hi, corr_n``
        (the correlations NaN where fewer than 3 runs are usable; ``corr_n`` counts them always).
    """
    names = list(t_cross)
    rules = ("replace", "drop")
    keys = ("r", "r_lo", "r_hi", "rho", "rho_lo", "rho_hi", "n")
    vals = {k: np.full((len(names), len(rules)), np.nan) for k in keys}
    for i, name in enumerate(names):
        for j, rule in enumerate(rules):
            try:
                res = tcross_mp_correlation(
                    t_cross[name], mp, horizon=horizon, mp_censored=mp_censored, censoring=rule,  # type: ignore[arg-type]
                    n_boot=n_boot, rng=np.random.default_rng(seed),
                )
            except ValueError:  # fewer than 3 usable runs: no correlation, but their count
                vals["n"][i, j] = _censored_pairs(t_cross[name], mp, horizon, mp_censored, None, rule)[4].sum()
                continue
            row = (res.pearson_r, *res.pearson_ci, res.spearman_rho, *res.spearman_ci, res.n_used)
            for k, v in zip(keys, row):
                vals[k][i, j] = v
    return annotate(xr.Dataset(
        {f"corr_{k}": (("variant", "censoring"), v) for k, v in vals.items()},
        coords={"variant": ("variant", np.asarray(names, dtype=str)), "censoring": ("censoring", np.asarray(rules, dtype=str))},
        attrs={"n_boot": n_boot, "ci_level": 0.95},
    ))


def _seed_halves(unique_seeds: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(selection, held-out) halves of the sorted unique seeds: the first ⌊n/2⌋, the rest."""
    return unique_seeds[: unique_seeds.size // 2], unique_seeds[unique_seeds.size // 2:]


def heldout_choice(
    t_cross: dict[str, Any],
    mp: Any,
    seeds: Any,
    *,
    horizon: Any,
    mp_censored: Any,
    n_boot: int = 2000,
    seed: int = 0,
) -> dict[str, Any]:
    """Choose a variant on half of the seeds, report its correlation on the other half.

    The seeds are sorted; the first ⌊n/2⌋ are the *selection* half, the rest the *held-out*
    half.  The chosen variant is the one with the largest Pearson r ('replace' censoring)
    on the selection runs; its Pearson r with a bootstrap CI on the held-out runs is the
    honest estimate of how well it predicts mp (nothing about the held-out runs entered
    the choice).  With fewer than two seeds no split exists: the choice is
    :data:`PRIOR_DEFAULT_VARIANT` and the held-out statistics are NaN.

    Returns:
        dict with ``variant``, ``selection_seeds``, ``heldout_seeds``, ``selection_r``
        (per variant), and ``pearson_r``, ``pearson_r_lo``, ``pearson_r_hi``, ``n_used`` on
        the held-out runs.
    """
    seeds = np.asarray(seeds)
    uniq = np.unique(seeds)
    nan = float("nan")
    out: dict[str, Any] = {"variant": PRIOR_DEFAULT_VARIANT, "selection_seeds": [], "heldout_seeds": [],
                           "selection_r": {}, "pearson_r": nan, "pearson_r_lo": nan, "pearson_r_hi": nan, "n_used": 0}
    if uniq.size < 2:
        return out
    sel_seeds, held_seeds = _seed_halves(uniq)
    sel, held = np.isin(seeds, sel_seeds), np.isin(seeds, held_seeds)
    hz = np.broadcast_to(np.asarray(horizon, dtype=np.float64), seeds.shape)
    mpv, cens = np.asarray(mp, dtype=np.float64), np.asarray(mp_censored, dtype=bool)
    scores = {}
    for name, tc in t_cross.items():
        tc = np.asarray(tc, dtype=np.float64)
        try:
            res = tcross_mp_correlation(tc[sel], mpv[sel], horizon=hz[sel], mp_censored=cens[sel], n_boot=1,
                                        rng=np.random.default_rng(seed))
        except ValueError:
            continue
        if np.isfinite(res.pearson_r):
            scores[name] = res.pearson_r
    out.update(selection_seeds=sel_seeds.tolist(), heldout_seeds=held_seeds.tolist(), selection_r=scores)
    if not scores:
        return out
    best = max(scores, key=lambda k: scores[k])
    tc = np.asarray(t_cross[best], dtype=np.float64)
    out["variant"] = best
    try:
        res = tcross_mp_correlation(tc[held], mpv[held], horizon=hz[held], mp_censored=cens[held], n_boot=n_boot,
                                    rng=np.random.default_rng(seed))
    except ValueError:
        return out
    out.update(pearson_r=res.pearson_r, pearson_r_lo=res.pearson_ci[0], pearson_r_hi=res.pearson_ci[1],
               n_used=res.n_used)
    return out


def heldout_forecasts(
    forecasts: dict[str, Any], mp: Any, seeds: Any, *, horizon: Any, mp_censored: Any, n_boot: int = 2000,
    seed: int = 0,
) -> xr.Dataset:
    """Each forecast's Pearson r with mp on the held-out seeds, under both censoring rules.

    A forecast is defined before any data (:data:`FORECAST_VARIANTS`; no choice among
    them is made here), so its honest score is its r on the seeds that no definition was
    tuned on: the second half of the sorted seeds, as in :func:`heldout_choice`. Dims
    ``forecast``, ``censoring``; variables ``corr_forecast_heldout_r`` (``_lo``, ``_hi``: the
    bootstrap CI) and ``corr_forecast_heldout_n`` (runs used), each with attr ``heldout_seeds``.
    Empty with fewer than two seeds. NaN where fewer than 3 held-out runs are usable.
    """
    seeds = np.asarray(seeds)
    uniq = np.unique(seeds)
    if uniq.size < 2 or not forecasts:
        return xr.Dataset()
    held_seeds = _seed_halves(uniq)[1]
    held = np.isin(seeds, held_seeds)
    hz = np.broadcast_to(np.asarray(horizon, dtype=np.float64), seeds.shape)[held]
    mpv, cens = np.asarray(mp, dtype=np.float64)[held], np.asarray(mp_censored, dtype=bool)[held]
    names, rules = list(forecasts), ["replace", "drop"]
    r = np.full((len(names), 2, 3), np.nan)
    n = np.zeros((len(names), 2), dtype=np.int64)
    for i, name in enumerate(names):
        tc = np.asarray(forecasts[name], dtype=np.float64)[held]
        for j, rule in enumerate(rules):
            try:
                res = tcross_mp_correlation(tc, mpv, horizon=hz, mp_censored=cens, censoring=rule, n_boot=n_boot,
                                            rng=np.random.default_rng(seed))
            except ValueError:
                continue
            r[i, j] = res.pearson_r, *res.pearson_ci
            n[i, j] = res.n_used
    dims = ("forecast", "censoring")
    out = xr.Dataset({"corr_forecast_heldout_r": (dims, r[..., 0]), "corr_forecast_heldout_r_lo": (dims, r[..., 1]),
                      "corr_forecast_heldout_r_hi": (dims, r[..., 2]), "corr_forecast_heldout_n": (dims, n)},
                     coords={"forecast": names, "censoring": rules})
    for v in out.data_vars:
        out[v].attrs["heldout_seeds"] = json.dumps([int(x) for x in held_seeds])
    return out


def study_correlations(ds: xr.Dataset) -> xr.Dataset:
    """The T_cross–mp block of a study dataset (dim ``run``; ``status``, ``mp``,
    ``mp_censored``, ``seed``, ``horizon`` and the crossing variables of
    :data:`CROSSING_VARIANTS` / :data:`FORECAST_VARIANTS` it holds), over its ``ok`` runs:

    - :func:`correlation_table` of every variant present under both censoring rules, with
      ``variant_description``;
    - ``corr_heldout_pearson_r`` (``_lo``, ``_hi``) and ``corr_heldout_n_used``: the
      :func:`heldout_choice` among the crossing variants (not the forecasts);
    - ``corr_forecast_heldout_r`` (``_lo``, ``_hi``, ``_n``; dims ``forecast``, ``censoring``):
      :func:`heldout_forecasts` of the forecast variants present, on the same held-out seeds;
    - ``corr_pearson_r`` … ``corr_n_boot_degenerate``: :meth:`CorrelationResult.to_dataset`
      of the chosen (default) variant, 'replace' censoring, bootstrap from ``default_rng(0)``;
    - attrs ``corr_default_variant``, ``corr_default_tcross`` (its variable),
      ``corr_selection_seeds``, ``corr_heldout_seeds``, ``corr_selection_r`` (JSON, r per
      variant on the selection seeds, 4 decimals), ``corr_censoring``, ``corr_n_boot``.

    Rule: ``not-learned`` and ``diverged`` runs and runs with NaN mp are left out (a horizon
    of a model that never learned its task says nothing about error control); a run
    without ``horizon`` takes the largest ``length``.  Empty when no variant is present or
    fewer than 3 runs are left.
    """
    ok = (ds["status"] == "ok") & np.isfinite(ds["mp"])
    variants = {**CROSSING_VARIANTS, **FORECAST_VARIANTS}
    present = {name: var for name, (var, _) in variants.items() if var in ds}
    if not present or int(ok.sum()) < 3:
        return xr.Dataset()
    sub = ds.sel(run=ok)
    horizon = sub["horizon"].values if "horizon" in sub else float(ds["length"].max())
    t_cross = {name: sub[var].values for name, var in present.items()}
    mp, seeds = sub["mp"].values, sub["seed"].values
    common = dict(horizon=horizon, mp_censored=sub["mp_censored"].values.astype(bool))
    out = correlation_table(t_cross, mp, **common)
    out["variant_description"] = ("variant", np.asarray([variants[n][1] for n in out["variant"].values], dtype=str))
    choice = heldout_choice({n: v for n, v in t_cross.items() if n in CROSSING_VARIANTS}, mp, seeds, **common)
    forecasts = heldout_forecasts({n: v for n, v in t_cross.items() if n in FORECAST_VARIANTS}, mp, seeds, **common)
    default = choice["variant"]
    desc = f"default variant {default!r} chosen on seeds {choice['selection_seeds']}"
    for key in ("pearson_r", "pearson_r_lo", "pearson_r_hi"):
        out[f"corr_heldout_{key}"] = (
            (), float(choice[key]), {"variant": default, "heldout_seeds": str(choice["heldout_seeds"]), "choice": desc},
        )
    out["corr_heldout_n_used"] = ((), int(choice["n_used"]))  # labels: dynlab.results.vocabulary
    res = tcross_mp_correlation(t_cross[default], mp, rng=np.random.default_rng(0), **common)
    cds = res.to_dataset()
    for v in cds.data_vars:
        cds[v].attrs["variant"] = default
    out = out.merge(cds.rename({v: f"corr_{v}" for v in cds.data_vars}))
    if forecasts.data_vars:
        out = out.merge(forecasts)
    out.attrs.update(
        corr_default_variant=default,
        corr_default_tcross=variants[default][0],
        corr_selection_seeds=str(choice["selection_seeds"]),
        corr_heldout_seeds=str(choice["heldout_seeds"]),
        corr_selection_r=json.dumps({k: round(float(v), 4) for k, v in choice["selection_r"].items()}),
        corr_censoring=res.censoring,
        corr_n_boot=res.n_boot,
    )
    return out


def format_correlation_report(ds: xr.Dataset) -> str:
    """The T_cross–mp table of a study dataset as Markdown ('' when it has none).

    One row per crossing-time variant: Pearson r and Spearman ρ with their 95 % bootstrap
    CIs under both censoring rules, the runs used, then the held-out line.
    """
    if "corr_r" not in ds:
        return ""
    lines = [
        "| variant | r (replace) | ρ (replace) | n | r (drop) | ρ (drop) | n |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]

    def cell(v: str, c: str, k: str) -> str:
        x = ds[f"corr_{k}"].sel(variant=v, censoring=c)
        lo, hi = ds[f"corr_{k}_lo"].sel(variant=v, censoring=c), ds[f"corr_{k}_hi"].sel(variant=v, censoring=c)
        if not np.isfinite(float(x)):
            return "—"
        return f"{float(x):+.2f} [{float(lo):+.2f}, {float(hi):+.2f}]"

    for v in ds["variant"].values:
        row = [str(v)]
        for c in ("replace", "drop"):
            n = ds["corr_n"].sel(variant=v, censoring=c)
            row += [cell(v, c, "r"), cell(v, c, "rho"), "—" if not np.isfinite(float(n)) else str(int(n))]
        lines.append("| " + " | ".join(row) + " |")
    default = ds.attrs.get("corr_default_variant", "")
    if "corr_heldout_pearson_r" in ds and np.isfinite(float(ds["corr_heldout_pearson_r"])):
        lines.append("")
        lines.append(
            f"default variant {default!r} (chosen on seeds {ds.attrs.get('corr_selection_seeds')}); "
            f"held-out seeds {ds.attrs.get('corr_heldout_seeds')}: Pearson r = "
            f"{float(ds['corr_heldout_pearson_r']):+.2f} [{float(ds['corr_heldout_pearson_r_lo']):+.2f}, "
            f"{float(ds['corr_heldout_pearson_r_hi']):+.2f}] over {int(ds['corr_heldout_n_used'])} runs"
        )
    elif default:
        lines.append("")
        lines.append(f"default variant {default!r} (fewer than two seeds: no held-out split)")
    return "\n".join(lines)
