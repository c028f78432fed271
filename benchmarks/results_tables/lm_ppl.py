"""README's paper-B cells on the PPL rise beyond the training length: the far/in ratio per
intervention, and against the training budget, the model size and the training context."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.report import far_in_ratio
from dynlab.lm.report.tables import RISE, size_grid

from results_tables.common import first_spec, join_and

def ratio_stats(ds: xr.Dataset, intervention: str) -> tuple[str, int, int]:
    """``("mean ± sd", "k of n (above 1: m)", n)`` of the far/in PPL ratio of one intervention:
    k of its n seeds rise (ratio > :data:`~dynlab.lm.report.tables.RISE`, every row's threshold)."""
    r = far_in_ratio(ds).values[ds["intervention"].values.astype(str) == intervention].astype(float)
    return f"{r.mean():.3f} ± {r.std(ddof=1):.3f}", rises(r), r.size


def most_rise(r) -> bool:
    """Whether most of the ratios ``r`` (one per seed; a missing seed, NaN, not rising) rise
    (> RISE): every verdict's reading of "rises"."""
    r = np.asarray(r, dtype=float)
    return 2 * int((r > RISE).sum()) > r.size


def rises(r: np.ndarray) -> str:
    """``"k of n (above 1: m)"``: how many of the ratios ``r`` rise (> RISE) and how many exceed 1."""
    return f"{int((r > RISE).sum())} of {r.size} (above 1: {int((r > 1).sum())})"


def budget_cell(ds: xr.Dataset) -> str:
    """README's "PPL rise vs training budget" cell: far PPL / in-range PPL (over (T/2, T], one
    reference for every budget) per checkpoint budget, with the seeds above RISE."""
    ok = ds["status"].values.astype(str) == "ok"
    ratio = (ds["ppl_far"] / ds["ppl_in"]).values[ok].astype(float)  # [run, budget]
    n = int(ok.sum())
    per = ", ".join(f"{float(b):g}× {ratio[:, i].mean():.3f} ({int((ratio[:, i] > RISE).sum())}/{n})"
                    for i, b in enumerate(ds["budget"].values))
    spec = first_spec(ds)["model"]
    params = int(ds["n_params"].values[ok][0])
    pin = ds["ppl_in"].values[ok].astype(float)
    return (f"{params:,}-parameter Mamba-2 (width {spec['d_model']}, no MLP), T_train "
            f"{int(ds['train_length'].values[0])}, {n} seeds, checkpoints inside one 32× run: far PPL / PPL over "
            f"(T/2, T] (seeds above {RISE}) at {per}; in-range PPL {pin[:, 0].mean():.1f} → {pin[:, -1].mean():.2f}")


def size_cell(ds: xr.Dataset) -> str:
    """The size-map cell: per width and T_train, the budgets at which most seeds rose
    (far_over_in > RISE; how many beside each) and the ratio at the largest budget (mean,
    and its largest seed); then the runs trained alone."""
    g = size_grid(ds)
    parts = []
    for d in g["d_model"].values:
        cells = []
        for t in g["train_length"].values:
            v = g["inrun"].sel(d_model=d, train_length=t)
            if not np.isfinite(v).any():
                continue
            done = v["budget"].values[np.isfinite(v).all("seed").values]
            counts = {b: int((v.sel(budget=b) > RISE).sum()) for b in done}
            rose = [f"{b:g}× ({k}/{v.sizes['seed']})" for b, k in counts.items() if 2 * k > v.sizes["seed"]]
            top = float(done.max())
            last = v.sel(budget=top)
            cells.append(f"T {int(t)}: most seeds rose at {join_and(rose) if rose else 'no budget'}, "
                         f"{float(last.mean()):.2f} at {top:g}× (seeds up to {float(last.max()):.3f})")
        parts.append(f"width {int(d)} ({int(g['blocks'].sel(d_model=d)):,} block parameters): " + "; ".join(cells))
    alone = ""
    if "alone" in g and 32 in g["train_length"].values:
        a, c = g["alone"].sel(train_length=32), g["inrun"].sel(train_length=32)
        ok = np.isfinite(a.values) & np.isfinite(c.values)
        diff = (a.values - c.values)[ok]
        per_width = {int(d): "/".join(f"{b:g}×" for b in a["budget"].values if np.isfinite(a.sel(d_model=d, budget=b)).any())
                     for d in a["d_model"].values}
        common = set(per_width.values())
        said = common.pop() if len(common) == 1 else ", ".join(f"{v} at width {d}" for d, v in per_width.items())
        alone = (f"; trained alone to {said} against the checkpoint at that budget: lower in "
                 f"{int((diff < 0).sum())} of {diff.size} runs, mean {diff.mean():+.3f}, median {np.median(diff):+.3f}")
    return f"far/in = far PPL / PPL over (T/2, T] (a rise: > {RISE}) by budget × Chinchilla: " + "; ".join(parts) + alone


def context_cell(ds: xr.Dataset) -> str:
    """README's "PPL rise vs training context" cell: the far/in ratio per size and T_train."""
    ok = ds["status"].values.astype(str) == "ok"
    parts = []
    for n in sorted({int(x) for x in ds["n_params"].values[ok]}):
        cells = []
        for length in sorted({int(x) for x in ds["train_length"].values[ok]}):
            sel = ok & (ds["n_params"].values == n) & (ds["train_length"].values == length)
            r = ds["far_in_ratio"].values[sel].astype(float)
            cells.append(f"{length}: {r.mean():.3f} ({int((r > RISE).sum())}/{r.size})")
        parts.append(f"{n:,} parameters: " + ", ".join(cells))
    tokens = _train_tokens_of(ds)
    return f"far/in ratio by T_train (seeds above {RISE}), {tokens:,} training tokens each; " + "; ".join(parts)


def _train_tokens_of(ds: xr.Dataset) -> int:
    train = first_spec(ds)["train"]
    return int(train["steps"] * train["batch_size"] * train["seq_len"])



def with_annealed(size: xr.Dataset, annealed: xr.Dataset | None) -> xr.Dataset:
    """The size map's runs with those of the ``size-annealed`` preset (the same recipe, its
    runs trained alone to the budgets where the map rises), as one dataset for
    :func:`~dynlab.lm.report.tables.size_grid` (only what the grid reads)."""
    keep = ("run", "annealed", "d_model", "train_length", "seed", "n_params", "budget")
    parts = [x[["far_over_in", "n_params"]] for x in (size, annealed) if x is not None]
    parts = [x.reset_coords([c for c in x.coords if c not in keep], drop=True) for x in parts]
    return xr.concat(parts, "run", join="outer") if len(parts) > 1 else parts[0]


def annealed_judgement(ds: xr.Dataset) -> list[tuple[int, int, float, np.ndarray, np.ndarray]]:
    """Each ``(width, T_train, budget, in-run ratios, annealed ratios)`` where most seeds rose
    (far_over_in > RISE) at an in-run checkpoint of the size map and a run trained alone to
    that budget exists (:func:`with_annealed`): the ratios per seed, in-run and annealed
    (a rise, in-run or alone, is one in most of the grid's seeds, a missing seed not rising)."""
    g = size_grid(ds)
    if "alone" not in g or "inrun" not in g:
        return []
    rows = []
    for d in g["d_model"].values:
        for t in g["train_length"].values:
            for b in g["budget"].values:
                c = g["inrun"].sel(d_model=d, train_length=t, budget=b).values.astype(float)
                a = g["alone"].sel(d_model=d, train_length=t, budget=b).values.astype(float)
                if most_rise(c) and np.isfinite(a).any():
                    rows.append((int(d), int(t), float(b), c, a))
    return rows


def annealed_holds(rows: list[tuple[int, int, float, np.ndarray, np.ndarray]]) -> list[tuple[int, int, float]]:
    """``(width, T_train, budget)`` of the :func:`annealed_judgement` rows whose rise holds
    when trained alone (most seeds rise alone too)."""
    return [(d, t, b) for d, t, b, _, a in rows if most_rise(a)]


def annealed_section(size: xr.Dataset, annealed: xr.Dataset) -> str:
    """docs/results.md's table of every run trained alone to a budget (the size preset's and
    the size-annealed preset's) beside the size map's in-run checkpoint at that budget, and
    how many in-run rises hold when trained alone."""
    from dynlab.lm.report.tables import alone_rows

    both = with_annealed(size, annealed)
    g = size_grid(both)
    rows = annealed_judgement(both)
    held = len(annealed_holds(rows))
    lines = alone_rows(g, [float(b) for b in g["budget"].values])
    return ("\n".join(lines).strip() + f"\n\nOf the {len(rows)} (width, T_train, budget) where most seeds rose at an "
            f"in-run checkpoint and a run trained alone exists, most seeds rise alone in {held}.\n")
