"""The ``state`` preset's reading: where small LMs learn to forget (Stuffed Mamba's threshold).

Stuffed Mamba (Chen et al., COLM 2025) finds that a recurrent LM fails beyond its training
length T_train unless T_train exceeds a *forget threshold* T_forget that grows linearly with
its state size. On a ``state`` dataset (state sizes × T_train × seeds, far/in at 16 ×
T_train) this module computes, under one rule (:data:`RULE`, fixed on a pilot seed before
the reported seeds ran):

- **rises**: a run's far/in ratio (:func:`dynlab.lm.report.tables.far_in_ratio`) above
  :data:`~dynlab.lm.report.tables.RISE` (1.05, the size map's threshold); only runs that learned
  (``status`` ok and ``converged``) count, the others are left out and counted;
- **T_forget** of a (state size, seed): the smallest T_train of the grid whose run does not
  rise (:func:`forget_thresholds`); censored below (the shortest does not rise: T_forget ≤
  it) or above (every run rises: T_forget > the longest); ``later_rises`` counts the runs
  that rise at a T_train above T_forget, which the threshold account says should not happen;
- **the fit**: T_forget = a + b · state_size by least squares over the uncensored (size,
  seed) points, the slope's 95 % interval from Student's t (:func:`forget_fit`);
- **paper A's lens**: the state map's slowest forgetting rate (``forget_rate``, the top
  Lyapunov exponent, :mod:`dynlab.lm.analysis.contraction`) and its memory horizon against far/in:
  Spearman correlations of ``memory_horizon / T_train`` with far/in, pooled and within each
  state size, Holm-corrected over that family (:func:`contraction_correlations`).
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from scipy import stats

from dynlab.analysis.contrasts import holm
from dynlab.lm.report.tables import RISE, far_in_ratio

__all__ = ["RULE", "contraction_correlations", "is_state_map", "forget_fit", "forget_grid", "forget_thresholds", "state_tables",
           "state_verdicts"]

#: The rule that reads the map, fixed on the pilot seed before the reported seeds ran.
RULE = {
    "rise": f"far/in > {RISE}",
    "learned": "status ok and converged",
    "t_forget": "smallest T_train of the grid whose run does not rise",
    "fit": "least squares T_forget = a + b * state_size over uncensored (size, seed) points; slope 95% CI (t)",
    "correlation": "Spearman of memory_horizon / T_train with far/in, pooled and within each state size, Holm",
}


def is_state_map(ds: xr.Dataset) -> bool:
    """Whether ``ds`` is a state map: one width, more than one recurrent state size, no
    budget dimension (the ``size`` preset varies the width, and the state with it)."""
    return ("state_size" in ds.coords and "d_model" in ds.coords and "budget" not in ds.dims
            and np.unique(ds["state_size"].values).size > 1 and np.unique(ds["d_model"].values).size == 1)


def _learned(ds: xr.Dataset) -> xr.DataArray:
    ok = ds["status"] == "ok"
    return ok & ds["converged"].astype(bool) if "converged" in ds else ok


def forget_grid(ds: xr.Dataset) -> xr.Dataset:
    """far/in (``ratio``), whether the run learned (``learned``) and, where the dataset has
    them, ``memory_horizon`` and ``forget_rate`` on the grid (state_size, train_length, seed)."""
    cols = {"ratio": far_in_ratio(ds), "learned": _learned(ds)}
    for name in ("memory_horizon", "forget_rate"):
        if name in ds:
            cols[name] = ds[name]
    flat = xr.Dataset(cols).assign_coords(state_size=ds["state_size"], train_length=ds["train_length"],
                                          seed=ds["seed"])
    return flat.set_index(run=["state_size", "train_length", "seed"]).unstack("run")


def forget_thresholds(grid: xr.Dataset) -> xr.Dataset:
    """Per (state_size, seed): ``t_forget`` (NaN when censored), ``censored`` (``""``;
    ``"below"``: T_forget ≤ ``bound``; ``"above"``: T_forget > ``bound``; ``"none"``: no run
    of the cell learned), ``bound``, ``later_rises`` (runs rising at a longer T_train than
    T_forget) and ``unlearned`` (runs of the cell that did not learn) — :data:`RULE`.

    A T_train whose run did not learn counts as neither rising nor not: the first quiet
    run is T_forget only when every shorter run learned (and rose); after an unlearned one
    it is an upper bound (censored below); when every learned run rises, the longest of them
    is the lower bound (censored above)."""
    lengths = grid["train_length"].values
    learned = grid["learned"].transpose("state_size", "seed", "train_length").values
    rises = ((grid["ratio"] > RISE) & grid["learned"]).transpose("state_size", "seed", "train_length").values
    quiet = ((grid["ratio"] <= RISE) & grid["learned"]).transpose("state_size", "seed", "train_length").values
    t = np.full(rises.shape[:2], np.nan)
    bound = np.full(rises.shape[:2], np.nan)
    cens = np.full(rises.shape[:2], "none", dtype=object)
    later = np.zeros(rises.shape[:2], dtype=int)
    for i, j in np.ndindex(*rises.shape[:2]):
        if not learned[i, j].any():
            continue
        first = np.flatnonzero(quiet[i, j])
        if first.size == 0:
            cens[i, j], bound[i, j] = "above", float(lengths[np.flatnonzero(learned[i, j])[-1]])
            continue
        k = int(first[0])
        later[i, j] = int(rises[i, j, k + 1:].sum())
        if k == 0 or not learned[i, j, :k].all():
            cens[i, j], bound[i, j] = "below", float(lengths[k])
        else:
            t[i, j], cens[i, j], bound[i, j] = float(lengths[k]), "", float(lengths[k])
    dims = ("state_size", "seed")
    return xr.Dataset({
        "t_forget": (dims, t), "censored": (dims, cens.astype(str)), "bound": (dims, bound),
        "later_rises": (dims, later), "unlearned": (~grid["learned"]).sum("train_length"),
    }, coords={"state_size": grid["state_size"], "seed": grid["seed"]})


def forget_fit(th: xr.Dataset) -> dict[str, float]:
    """:data:`RULE`'s line through the uncensored thresholds: ``slope`` (tokens of T_forget
    per state entry), its 95 % interval ``slope_lo``/``slope_hi``, ``intercept``, ``r`` and
    ``n`` (points); NaN with fewer than 3 points or a single state size."""
    x, y = np.meshgrid(th["state_size"].values, th["seed"].values, indexing="ij")
    t = th["t_forget"].values
    keep = np.isfinite(t)
    x, y = x[keep].astype(float), t[keep]
    out = {"n": int(keep.sum()), "slope": np.nan, "slope_lo": np.nan, "slope_hi": np.nan, "intercept": np.nan,
           "r": np.nan}
    if keep.sum() < 3 or np.unique(x).size < 2:
        return out
    fit = stats.linregress(x, y)
    half = stats.t.ppf(0.975, len(x) - 2) * fit.stderr
    out.update(slope=fit.slope, slope_lo=fit.slope - half, slope_hi=fit.slope + half, intercept=fit.intercept,
               r=fit.rvalue)
    return out


def contraction_correlations(grid: xr.Dataset) -> list[dict]:
    """Spearman ρ of ``memory_horizon / T_train`` with far/in over learned runs: pooled
    (``group`` "pooled") and within each state size, p-values Holm-corrected over that family."""
    if "memory_horizon" not in grid:
        return []
    rel = grid["memory_horizon"] / grid["train_length"]
    rows = []
    for label, sel in [("pooled", {})] + [(f"state {int(s)}", {"state_size": s}) for s in grid["state_size"].values]:
        a, b, ok = rel.sel(sel).values.ravel(), grid["ratio"].sel(sel).values.ravel(), grid["learned"].sel(sel).values.ravel()
        keep = ok & np.isfinite(a) & np.isfinite(b)
        rho, p = stats.spearmanr(a[keep], b[keep]) if keep.sum() >= 3 else (np.nan, np.nan)
        rows.append({"group": label, "n": int(keep.sum()), "rho": float(rho), "p": float(p)})
    # Holm over the whole family fixed in advance (pooled and every size): a test that could
    # not run (fewer than 3 learned runs) counts with p = 1, so it never weakens the others' correction
    adjusted = holm([r["p"] if np.isfinite(r["p"]) else 1.0 for r in rows])
    for r, adj in zip(rows, adjusted):
        if np.isfinite(r["p"]):
            r["p_holm"] = float(adj)
    return rows


def _median_bounds(th: xr.Dataset, size) -> tuple[float, float]:
    """The median over seeds of a state size's T_forget as an interval: a threshold censored
    below lies in (0, bound], one censored above in (bound, ∞); a seed with no learned run
    is left out (both NaN when no seed is left)."""
    lo, hi = [], []
    for seed in th["seed"].values:
        c = str(th["censored"].sel(state_size=size, seed=seed).values)
        b = float(th["bound"].sel(state_size=size, seed=seed))
        if c == "none":
            continue
        lo.append(0.0 if c == "below" else b)
        hi.append(np.inf if c == "above" else b)
    return (float(np.median(lo)), float(np.median(hi))) if lo else (np.nan, np.nan)


def state_verdicts(ds: xr.Dataset) -> dict[str, str]:
    """The pre-registered verdicts (docs/preregistration-forget-threshold.md) on a ``state``
    dataset, each ``supported``, ``refuted`` or ``not decided``:

    - ``threshold`` (hypothesis 1): supported when the fit's slope interval lies above zero
      with at least 6 uncensored points and at most 10 % of the learned runs rise above
      their cell's T_forget; refuted when the interval lies at or below zero, or when the
      median T_forget over seeds does not increase from the smallest state to the largest
      (a median known only as a censored interval decides this only when the intervals do
      not overlap: the largest state's lies at or below the smallest's); not decided else;
    - ``contraction`` (hypothesis 2): supported when the pooled Spearman ρ is positive with
      Holm p < 0.05 and at least three of the four within-size ρ are positive; refuted when
      the pooled ρ is negative with Holm p < 0.05; not decided else (also without the
      ``memory_horizon`` the test needs)."""
    grid = forget_grid(ds)
    th = forget_thresholds(grid)
    fit = forget_fit(th)
    learned = int(grid["learned"].sum())
    later = int(th["later_rises"].sum())
    sizes = sorted(float(x) for x in th["state_size"].values)
    small, large = _median_bounds(th, sizes[0]), _median_bounds(th, sizes[-1])
    if fit["slope_lo"] > 0 and fit["n"] >= 6 and later <= 0.1 * learned:
        threshold = "supported"
    elif fit["slope_hi"] <= 0 or large[1] <= small[0]:
        threshold = "refuted"
    else:
        threshold = "not decided"
    corr = {r["group"]: r for r in contraction_correlations(grid)}
    pooled = corr.get("pooled", {})
    rho, p = pooled.get("rho", np.nan), pooled.get("p_holm", np.nan)
    within = sum(r["rho"] > 0 for g, r in corr.items() if g != "pooled")
    if rho > 0 and p < 0.05 and within >= 3:
        contraction = "supported"
    elif rho < 0 and p < 0.05:
        contraction = "refuted"
    else:
        contraction = "not decided"
    return {"threshold": threshold, "contraction": contraction}


def state_tables(ds: xr.Dataset) -> str:
    """Markdown of a ``state`` dataset: far/in per (state size, T_train) (mean over seeds and
    how many rise), T_forget per state size (per seed, censoring marked), the fit, and the
    contraction correlations."""
    grid = forget_grid(ds)
    th = forget_thresholds(grid)
    lengths = [int(t) for t in grid["train_length"].values]
    later = int(th["later_rises"].sum())
    lines = [f"Rule: {RULE['rise']} rises; T_forget = {RULE['t_forget']}; runs that learned ({RULE['learned']}); "
             f"{later} run(s) rise above their cell's T_forget; {int(th['unlearned'].sum())} did not learn.", "",
             "| state size | " + " | ".join(f"T={t}" for t in lengths) + " | T_forget per seed |",
             "|---:|" + "---:|" * len(lengths) + "---|"]
    for s in grid["state_size"].values:
        cells = []
        for t in lengths:
            r = grid["ratio"].sel(state_size=s, train_length=t).where(grid["learned"].sel(state_size=s, train_length=t))
            v = r.values[np.isfinite(r.values)]
            cells.append("—" if v.size == 0 else f"{v.mean():.3f} ({int((v > RISE).sum())}/{v.size})")
        per_seed = [_threshold_cell(th, s, seed, lengths) for seed in th["seed"].values]
        lines.append(f"| {int(s)} | " + " | ".join(cells) + f" | {', '.join(per_seed)} |")
    fit = forget_fit(th)
    lines += ["", f"Fit over {fit['n']} uncensored points: T_forget = {fit['intercept']:.4g} + {fit['slope']:.4g} × "
              f"state size (slope 95% CI {fit['slope_lo']:.4g} to {fit['slope_hi']:.4g}; r = {fit['r']:.3f})."]
    corr = contraction_correlations(grid)
    if corr:
        lines += ["", "| memory horizon / T_train vs far/in | n | Spearman ρ | p (Holm) |", "|---|---:|---:|---:|"]
        lines += [f"| {r['group']} | {r['n']} | {r['rho']:.3f} | {r.get('p_holm', np.nan):.3g} |" for r in corr]
    verdicts = state_verdicts(ds)
    lines += ["", f"Pre-registered verdicts: hypothesis 1 (forget threshold) {verdicts['threshold']}; hypothesis 2 "
              f"(contraction) {verdicts['contraction']}."]
    return "\n".join(lines)


def _threshold_cell(th: xr.Dataset, s, seed, lengths: list[int]) -> str:
    c = str(th["censored"].sel(state_size=s, seed=seed).values)
    b = th["bound"].sel(state_size=s, seed=seed)
    if c == "none":
        return "— (none learned)"
    if c == "below":
        return f"≤{int(b)}"
    if c == "above":
        return f">{int(b)}"
    return str(int(th["t_forget"].sel(state_size=s, seed=seed)))
