"""README's paper-A tables: learned runs and mp per architecture and group, the T_cross-mp
correlations of the crossing-time variants, the held-out r and the held-out horizon forecast."""

from __future__ import annotations

import json

import numpy as np
import xarray as xr

from dynlab.report import learned_mp

from results_tables.common import dataset, first_spec, paired, prose, seed_range

#: Crossing-time variants in README's paper-A table, with what each is.
README_VARIANTS = {"q": "paper A's literal R/M", "q_par": "", "q_dec": "trained decoder", "probe": "",
                   "forecast_dec": "fitted inside the training length",
                   "forecast_horizon": "decoder margins drifting inside the training length"}


def paper_a_section() -> str:
    """README's paper-A tables: learned runs and mp per architecture and group, the T_cross–mp
    correlations of :data:`README_VARIANTS`, and the held-out r of the default variant."""
    ds = dataset("group-tracking-sweep")
    cells = learned_mp(ds)
    archs, groups = list(dict.fromkeys(a for a, _ in cells)), list(dict.fromkeys(g for _, g in cells))
    per_cell = max(n for _, n, _ in cells.values())
    horizon = max(first_spec(ds)["eval"]["lengths"])
    out = [prose(f"Preset `{ds.attrs['preset']}`, seeds {seed_range(ds['seed'].values)}, {ds.sizes['run']} runs. "
                  f"Learned runs of {per_cell} per architecture and group, and the median (range) of their "
                  f"max-pass length mp, evaluated to {horizon}:"), "",
           "| architecture | " + " | ".join(groups) + " |", "| --- |" + " --- |" * len(groups)]
    for arch in archs:
        row = []
        for group in groups:
            n_ok, n, mp = cells[(arch, group)]
            row.append(f"{n_ok}/{n}" + (f", {np.median(mp):.0f} ({mp.min():.0f}–{mp.max():.0f})" if mp.size else ""))
        out.append(f"| {arch} | " + " | ".join(row) + " |")
    default = ds.attrs["corr_default_variant"]
    n_learned = int(ds["corr_n"].sel(variant=default, censoring="replace"))
    out += ["", prose(f"Pearson r between each variant's T_cross and mp over the {n_learned} learned runs, "
                       f"with {float(ds.attrs['ci_level']) * 100:.0f} % bootstrap CIs. Under 'replace' a crossing "
                       "that never happened is set to its run's horizon; 'drop' leaves out every run with T_cross "
                       "or mp censored:"), "",
            "| variant | r, replace | r, drop | n (replace / drop) |", "| --- | --- | --- | --- |"]
    for variant, what in README_VARIANTS.items():
        notes = [n for n in (what, "the default" if variant == default else "") if n]
        r = {c: "{} [{}, {}]".format(*(paired(float(ds[f"corr_r{k}"].sel(variant=variant, censoring=c)))
                                       for k in ("", "_lo", "_hi"))) for c in ("replace", "drop")}
        n = {c: int(ds["corr_n"].sel(variant=variant, censoring=c)) for c in ("replace", "drop")}
        label = f"`{variant}`" + (f" ({'; '.join(notes)})" if notes else "")
        out.append(f"| {label} | {r['replace']} | {r['drop']} | {n['replace']} / {n['drop']} |")
    held = [paired(float(ds[f"corr_heldout_pearson_r{k}"])) for k in ("", "_lo", "_hi")]
    out += ["", prose(f"On held-out seeds {seed_range(json.loads(ds.attrs['corr_heldout_seeds']))} (the default "
                       f"chosen on seeds {seed_range(json.loads(ds.attrs['corr_selection_seeds']))}), `{default}` gives "
                       f"r = {held[0]} [{held[1]}, {held[2]}] over {int(ds['corr_heldout_n_used'])} runs."
                       + _forecast_sentence(ds))]
    return "\n".join(out)


#: The horizon forecast README reports on held-out seeds, and the goal it is held to.
README_FORECAST, FORECAST_GOAL = "forecast_horizon", 0.7


def _forecast_sentence(ds: xr.Dataset) -> str:
    """The held-out r of :data:`README_FORECAST` under 'drop' (the failing runs), beside
    ``forecast_dec``; empty for a dataset without held-out forecast correlations."""
    if "corr_forecast_heldout_r" not in ds or README_FORECAST not in ds["forecast"].values:
        return ""

    def cell(name: str) -> str:
        r = [paired(float(ds[f"corr_forecast_heldout_r{k}"].sel(forecast=name, censoring="drop")))
             for k in ("", "_lo", "_hi")]
        return f"r = {r[0]} [{r[1]}, {r[2]}] over {int(ds['corr_forecast_heldout_n'].sel(forecast=name, censoring='drop'))} runs"

    r = float(ds["corr_forecast_heldout_r"].sel(forecast=README_FORECAST, censoring="drop"))
    verdict = "at least" if r >= FORECAST_GOAL else "short of"
    seeds = seed_range(json.loads(ds["corr_forecast_heldout_r"].attrs["heldout_seeds"]))
    return (f" The horizon forecast `{README_FORECAST}` (`T_horizon`, from steps ≤ the training length only; "
            f"docs/error-control.md), defined on seeds 0–1, gives on seeds {seeds} under 'drop' {cell(README_FORECAST)}"
            f" ({verdict} {FORECAST_GOAL}); `forecast_dec` gives {cell('forecast_dec')}.")
