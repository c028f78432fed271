"""The fixed points of the return maps and the pre-registered horizon forecast on the sweep's
fresh seeds 5-9: docs/results.md's last section (tables) and README's lines on it."""

from __future__ import annotations

import numpy as np
import xarray as xr

from results_tables.common import DATA, dataset, paired, prose, r_ci, seed_range
from results_tables.paper_a import FORECAST_GOAL
from results_tables.reproduction import CROSS_CPU

#: The sweep recipe on fresh seeds, trained after the pre-registered forecast was defined:
#: the fixed-point mechanism and the forecast's score (the last section of docs/results.md).
FRESH_LABEL = "group-tracking-sweep-seeds5-9"
FRESH_HEADING = "Fixed points of the return map, and the pre-registered horizon forecast"
FRESH_COMMAND = "dynlab study group-tracking --models all --preset sweep --seeds 5,6,7,8,9"
FRESH_NOTE = ("the sweep recipe on seeds 5–9, trained once after the forecast `T_prereg` was defined "
              "(docs/error-control.md); ρ⊥, ρ∥ and the fixed points are the `fp_*` variables")



#: The sweep's first seeds (0–4); the fixed points come from their AVX2 re-run (:data:`CROSS_CPU`)
#: when it is committed, else from this dataset when it carries them.
SWEEP_LABEL = "group-tracking-sweep"

#: How the fixed-point solver came to find every fixed point, stated wherever the found counts are:
#: short (README) and long (docs/results.md).
SOLVER_HISTORY = "since the solver gained orbit starts; its first version found them in 27 of 30 runs of seeds 5–9"
SOLVER_HISTORY_LONG = ("the solver's orbit starts were added after its first version found them in 27 of 30 "
                       "runs on seeds 5–9, where it missed tanh-rnn on S3 seeds 5 and 8 and state-gated-rnn "
                       "on S3 seed 5; seeds 0–4 were solved with them from the start")

#: The run variables the fixed-point section reads from each sweep dataset.
_POOLED_VARS = ("status", "mp", "mp_censored", "horizon", "recovery_rate", "failure_mode_dec", "fp_residual",
                "fp_rho_perp", "fp_rho_par", "fp_drift", "T_cross_fp", "T_cross_par", "T_cross_dec")


def sweep_sets() -> list[tuple[str, xr.Dataset]]:
    """``[(seeds, dataset)]``: the fresh seeds 5–9, and, when the sweep's seeds 0–4 carry the
    fixed points, those and both pooled (the run variables of :data:`_POOLED_VARS`)."""
    fresh = dataset(FRESH_LABEL)
    sets = [(seed_range(fresh["seed"].values), fresh)]
    sweep = dataset(CROSS_CPU[1] if (DATA / f"{CROSS_CPU[1]}.nc").is_file() else SWEEP_LABEL)
    if all(v in sweep for v in _POOLED_VARS) and all(v in fresh for v in _POOLED_VARS):
        pooled = xr.concat([d[list(_POOLED_VARS)] for d in (sweep, fresh)], dim="run", coords="minimal",
                           compat="override", join="outer")
        pooled = pooled.assign_coords(run=np.arange(pooled.sizes["run"]))
        sets = [(seed_range(sweep["seed"].values), sweep), *sets,
                (seed_range(pooled["seed"].values), pooled)]
    return sets


def _found_line(sets: list[tuple[str, xr.Dataset]]) -> str:
    from dynlab.tracking.analysis.fixed_points.mechanism import mechanism_correlations

    parts = []
    for seeds, ds in sets:
        m = mechanism_correlations(ds)
        sd = m["state_dependent"]
        parts.append(f"seeds {seeds}: {sd['found']} of {sd['n']} learned state-dependent runs, {m['found']} of "
                     f"{m['n_ok']} learned runs")
    return "; ".join(parts)


def _family_rows(sets: list[tuple[str, xr.Dataset]]) -> list[str]:
    """The ρ⊥–mp correlations within each family beside the pooled ones above, and which
    family's every learned run has a censored mp (its pooled 'replace' r is then mostly the
    split between the families; :func:`dynlab.tracking.analysis.fixed_points.mechanism.mechanism_correlations`)."""
    from dynlab.tracking.analysis.fixed_points.mechanism import mechanism_correlations

    rows = [prose("Within each family (the pooled rows above mix the two, and the recovery rate's pooled r "
                  "can have the opposite sign of the affine runs' own; a family whose every learned run "
                  "passed every length has mp censored at the longest length: its own r is undefined, the "
                  "pooled r under 'replace' then mostly measures the split between the families, and under "
                  "'drop' it is the other family's r):"), "",
            "| seeds | family | log ρ⊥ against recovery along U⊥ | n | ρ⊥ against mp, replace | n "
            "| ρ⊥ against mp, drop | n | every mp censored |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for seeds, d in sets:
        m = mechanism_correlations(d)
        for family, c in m.get("by_family", {}).items():
            rec, rep, drop = c["recovery_perp"], c["mp_rho_perp_replace"], c["mp_rho_perp_drop"]
            cens = "yes" if family in m["censored_families"] else "no"
            cells = [r_ci(c) if np.isfinite(c["r"]) else "undefined" for c in (rec, rep, drop)]
            rows.append(f"| {seeds} | {family} | {cells[0]} | {rec['n']} | {cells[1]} | {rep['n']} | {cells[2]} "
                        f"| {drop['n']} | {cens} |")
    return rows


def fixed_points_section() -> str:
    """docs/results.md's fixed-point section, from :data:`FRESH_LABEL` (and seeds 0–4, :func:`sweep_sets`,
    when their dataset carries the fixed points): how many learned runs have fixed points, the mechanism correlations
    (:func:`dynlab.tracking.analysis.fixed_points.mechanism.mechanism_correlations`), Corollary 1's predicted crossing
    (:func:`dynlab.tracking.analysis.fixed_points.mechanism.corollary1_correlations`) and the pre-registered forecast's score
    (:func:`dynlab.tracking.analysis.preregistered.preregistered_scores`, seeds 5–9 only)."""
    from dynlab.tracking.analysis.fixed_points.mechanism import corollary1_correlations, mechanism_correlations
    from dynlab.tracking.analysis.preregistered import PREREGISTERED_DEFINITION, preregistered_scores

    ds = dataset(FRESH_LABEL)
    sets = sweep_sets()
    p = preregistered_scores(ds)
    out = [prose(f"Preset `{ds.attrs['preset']}` on seeds {seed_range(ds['seed'].values)}, {ds.sizes['run']} runs, "
                  "trained after the forecast below was defined, and the same recipe's seeds 0–4 where their "
                  "dataset carries the fixed points. Fixed points of the return maps (`fp_*`, "
                  f"docs/error-control.md) for every symbolic state and word with residual ≤ 1e-8: "
                  f"{_found_line(sets)} ({SOLVER_HISTORY_LONG}). Across the learned runs, Pearson r and Spearman ρ with 95 % "
                  "bootstrap CIs (ρ⊥, ρ∥: spectral radius per token on U⊥ and U at the fixed points, median "
                  "over states):"), "",
           "| seeds | at the fixed points | against | r | ρ | n |", "| --- | --- | --- | --- | --- | --- |"]
    modes_text = []
    for seeds, d in sets:
        m = mechanism_correlations(d)
        rows = [("log ρ⊥", "recovery rate along U⊥", m["recovery_perp"]),
                ("log ρ∥", "recovery rate along U", m["recovery_par"]),
                ("ρ⊥", "mp, replace", m["mp_rho_perp_replace"]), ("ρ⊥", "mp, drop", m["mp_rho_perp_drop"]),
                ("abs(ρ∥ − 1)", "mp, replace", m["mp_par_dev_replace"]),
                ("abs(ρ∥ − 1)", "mp, drop", m["mp_par_dev_drop"])]
        for x, y, c in rows:
            out.append(f"| {seeds} | {x} | {y} | {r_ci(c)} | {r_ci(c, 'rho')} | {c['n']} |")
        modes_text.append(f"seeds {seeds}: " + "; ".join(
            f"{mode} {v['n']} runs, median ρ⊥ {v['rho_perp']:.3f}, abs(ρ∥ − 1) {v['par_dev']:.3f}"
            for mode, v in m.get("modes", {}).items() if v["n"]))
    out += ["", prose("By failure mode of `q_dec`: " + "; ".join(modes_text) + ".")]
    out += ["", *_family_rows(sets)]
    c1 = [(seeds, corollary1_correlations(d)) for seeds, d in sets if "T_cross_fp" in d]
    if c1:
        out += ["", prose("Corollary 1 from the return maps: `T_cross_fp` = t_ref + (τ·M − R∥)/η̄ at t_ref, with "
                           "η̄ (`fp_drift`) the mean drift per token along U of the class centroids under the "
                           "state-preserving words (docs/error-control.md), against the measured crossing of q∥ "
                           "(`T_cross_par`, what it predicts), the trained decoder's crossing (`T_cross_dec`) and "
                           "mp, over the learned runs:"), "",
                "| seeds | T_cross_fp against | r | ρ | n |", "| --- | --- | --- | --- | --- |"]
        names = {"par": "T_cross_par", "dec": "T_cross_dec", "mp": "mp"}
        for seeds, c in c1:
            for target, name in names.items():
                for rule in ("replace", "drop"):
                    r = c[f"{target}_{rule}"]
                    out.append(f"| {seeds} | {name}, {rule} | {r_ci(r)} | {r_ci(r, 'rho')} | {r['n']} |")
        out += ["", prose("Runs with a finite `T_cross_fp` (a crossing predicted within the horizon): " + "; ".join(
            f"seeds {seeds}: {c['predicted']} of {c['n_ok']}" for seeds, c in c1) + ".")]
    drop, rep = p["drop"], p["replace"]
    verdict = "at least" if drop["r"] >= FORECAST_GOAL else "short of"
    out += ["", prose(f"The pre-registered horizon forecast `{PREREGISTERED_DEFINITION}` (docs/error-control.md) "
                       f"gives on seeds {seed_range(ds['seed'].values)} under 'drop' r = {r_ci(drop)}, ρ = "
                       f"{r_ci(drop, 'rho')} over {drop['n']} runs ({verdict} {FORECAST_GOAL}); under 'replace' "
                       f"r = {r_ci(rep)}, ρ = {r_ci(rep, 'rho')} over {rep['n']} runs.")]
    return "\n".join(out)


def fresh_seeds_section() -> str:
    """README's lines on the fresh seeds 5–9 (the pre-registered forecast's score) and on the
    fixed-point mechanism over every sweep seed that carries it (docs/results.md has the tables)."""
    from dynlab.tracking.analysis.fixed_points.mechanism import corollary1_correlations, mechanism_correlations
    from dynlab.tracking.analysis.preregistered import PREREGISTERED_DEFINITION, preregistered_scores

    ds = dataset(FRESH_LABEL)
    p = preregistered_scores(ds)
    seeds, pooled = sweep_sets()[-1]
    m = mechanism_correlations(pooled)
    drop, rep = p["drop"], p["replace"]
    verdict = "at least" if drop["r"] >= FORECAST_GOAL else "short of"
    perp, mp_r = m["recovery_perp"], m["mp_rho_perp_replace"]
    sd, fam = m["state_dependent"], m.get("by_family", {})
    text = (f"**Fresh seeds.** `{PREREGISTERED_DEFINITION}`, committed before seeds {seed_range(ds['seed'].values)} "
            f"were trained (docs/error-control.md), gives on them r = {r_ci(drop)} over {drop['n']} runs under "
            f"'drop' ({verdict} {FORECAST_GOAL}), {r_ci(rep)} under 'replace'. Seeds {seeds}: {sd['found']} of "
            f"{sd['n']} learned state-dependent runs have fixed points for every state and word ({SOLVER_HISTORY}).")
    if {"affine", "state-dependent"} <= set(fam):
        aff, dep = fam["affine"], fam["state-dependent"]
        text += (f" Log ρ⊥ predicts the recovery rate along U⊥ within the state-dependent runs (r = "
                 f"{r_ci(dep['recovery_perp'])}, n {dep['recovery_perp']['n']}) but goes the other way within the "
                 f"affine ones ({r_ci(aff['recovery_perp'])}, n {aff['recovery_perp']['n']}; pooled "
                 f"{paired(perp['r'])}). ρ⊥ against mp pooled under 'replace', {r_ci(mp_r)}, is the split between the "
                 f"families (every state-dependent mp is censored); within the affine runs it is "
                 f"{r_ci(aff['mp_rho_perp_replace'])} (replace), {r_ci(aff['mp_rho_perp_drop'])} (drop)")
    else:
        text += (f" Log ρ⊥ predicts the recovery rate along U⊥ (r = {r_ci(perp)}) and ρ⊥ predicts mp (r = "
                 f"{r_ci(mp_r)} replace, {r_ci(m['mp_rho_perp_drop'])} drop)")
    if "T_cross_fp" in pooled:
        c = corollary1_correlations(pooled)
        text += (f"; Corollary 1's `T_cross_fp`, from the return-map drift, gives r = {r_ci(c['par_drop'])} "
                 f"against the measured q∥ crossing and {r_ci(c['mp_drop'])} against mp (drop)")
    return prose(text + ".")

