"""README's paragraph after the paper-A tables (what the 'replace' r rests on, the literal q),
and what reproduces across machines: the same sweep with the torch loops and on another CPU
type, matched run by run (docs/results.md's reproduction tables name the same pairs)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.report import learned_mp

from results_tables.common import DATA, dataset, first_spec, join_and, paired, prose, wall_time

#: Two runs of the same sweep on one machine: the compiled C loops (default) and the torch loops.
REPRODUCTION = ("group-tracking-sweep", "group-tracking-sweep-torch-loops", "C loops", "torch loops")

REPRODUCTION_NOTE = """The same sweep spec run twice on one machine, once with the compiled C loops (the
default) and once with `DYNLAB_C_KERNELS=0` (the torch loops): the two differ only by
floating-point rounding, as two CPU types do. Statuses, learned counts, mp medians and the
correlations are what to compare across machines; the per-seed mp of a cell at the edge of
what it tracks moves with rounding (a trajectory that leaves the readout's basin a step
earlier or later)."""


#: The same sweep spec trained on two CPU types: the committed sweep (written on an AVX-512
#: CPU) and its seeds 0–4 trained again on an AVX2-only CPU, which also carries the fixed points.
CROSS_CPU = ("group-tracking-sweep", "group-tracking-sweep-avx2", "AVX-512", "AVX2")

CROSS_CPU_NOTE = """The same sweep spec trained on two CPU types (the committed sweep on an AVX-512 CPU,
`group-tracking-sweep-avx2` on an AVX2-only one, at a later code version that adds the fixed
points): the runs are matched by run id. AVX2 and AVX-512 round float sums differently, so
this is the comparison a user re-running the sweep on their own machine makes."""

_NUMBER_WORDS = {0: "zero", 1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


def _matched(a: xr.Dataset, b: xr.Dataset) -> tuple[xr.Dataset, xr.Dataset]:
    """The runs of ``a`` and ``b`` with the same ``run_id``, in ``a``'s order."""
    where_b = {r: i for i, r in enumerate(b["run_id"].values.astype(str))}
    rows_a = [i for i, r in enumerate(a["run_id"].values.astype(str)) if r in where_b]
    return a.isel(run=rows_a), b.isel(run=[where_b[str(a["run_id"].values[i])] for i in rows_a])


def reproduction_summary(a: xr.Dataset, b: xr.Dataset) -> dict:
    """The numbers README quotes from two runs of one sweep (``a`` the reference):

    ``runs`` matched by run id, ``same_status`` among them, ``max_learned_diff`` (the
    largest difference of learned counts in an architecture × group cell), ``moved_archs``
    (architectures of the cells where a run learned in both has a different mp), ``moved``
    / ``moved_of`` (such runs / runs learned in both, in those cells), ``example`` (the
    moved cell whose mp median over its learned runs changed most: arch, group, median in
    ``a``, median in ``b``)."""
    a, b = _matched(a, b)
    both = (a["status"].values.astype(str) == "ok") & (b["status"].values.astype(str) == "ok")
    la, lb = learned_mp(a), learned_mp(b)
    arch, group = a["arch"].values.astype(str), a["group"].values.astype(str)
    moved_archs, moved, moved_of, example, worst = [], 0, 0, None, -1.0
    for key in la:
        rows = both & (arch == key[0]) & (group == key[1])
        n_moved = int(np.sum(a["mp"].values[rows] != b["mp"].values[rows]))
        if n_moved == 0:
            continue
        moved_archs += [key[0]] if key[0] not in moved_archs else []
        moved, moved_of = moved + n_moved, moved_of + int(rows.sum())
        med_a, med_b = float(np.median(la[key][2])), float(np.median(lb[key][2]))  # of each one's learned runs
        change = abs(np.log(med_b / med_a))
        if change > worst:
            worst, example = change, (key[0], key[1], med_a, med_b)
    return {"runs": a.sizes["run"],
            "same_status": int((a["status"].values.astype(str) == b["status"].values.astype(str)).sum()),
            "max_learned_diff": max(abs(la[k][0] - lb[k][0]) for k in la),
            "moved_archs": moved_archs, "moved": moved, "moved_of": moved_of, "example": example}


def family_correlation(ds: xr.Dataset, variant: str, family: str) -> dict[str, dict[str, float]]:
    """Pearson r (``r``, ``lo``, ``hi``, ``n`` by censoring rule) of ``variant``'s T_cross
    against mp over the learned runs of one ``family`` only, with the same rules and
    bootstrap as the study's pooled table (:func:`dynlab.analysis.correlation.correlation_table`)."""
    from dynlab.analysis.correlation import CROSSING_VARIANTS, correlation_table

    keep = (ds["status"].values.astype(str) == "ok") & np.isfinite(ds["mp"].values) \
        & (ds["family"].values.astype(str) == family)
    s = ds.isel(run=np.flatnonzero(keep))
    t = correlation_table({variant: s[CROSSING_VARIANTS[variant][0]].values}, s["mp"].values,
                          horizon=s["horizon"].values, mp_censored=s["mp_censored"].values.astype(bool))
    return {k: {c: float(t[f"corr_{name}"].sel(variant=variant, censoring=c)) for c in ("replace", "drop")}
            for k, name in (("r", "r"), ("lo", "r_lo"), ("hi", "r_hi"), ("n", "n"))}


def _ci(c: dict[str, dict[str, float]], censoring: str) -> str:
    return f"{paired(c['r'][censoring])} [{paired(c['lo'][censoring])}, {paired(c['hi'][censoring])}]"


def _r(ds: xr.Dataset, variant: str, censoring: str, part: str = "") -> float:
    return float(ds[f"corr_r{part}"].sel(variant=variant, censoring=censoring))



def _describes(ds: xr.Dataset, variant: str) -> str:
    """How close ``variant``'s crossing lands to mp in the learned affine runs with both
    uncensored: a crossing at the failure describes it rather than foretelling it."""
    from dynlab.analysis.correlation import CROSSING_VARIANTS

    t = ds[CROSSING_VARIANTS[variant][0]].values.astype(float)
    keep = ((ds["status"].values.astype(str) == "ok") & (ds["family"].values.astype(str) == "affine")
            & np.isfinite(t) & ~ds["mp_censored"].values.astype(bool))
    close = int((np.abs(t[keep] - ds["mp"].values[keep]) <= 0.1 * ds["mp"].values[keep]).sum())
    return (f"Its crossing lands within 10 % of mp in {close} of those {int(keep.sum())} runs: it describes the "
            "failure as it happens more than it predicts it; the predictive test is the forecasts from steps ≤ the "
            "training length (held-out seeds above, fresh seeds below).")


def paper_a_reproduction_section() -> str:
    """README's paragraph after the paper-A tables: what the 'replace' r rests on, the
    uncensored r, the literal q, and what the torch-loops run of the same sweep shares with
    the C-loops one (:func:`reproduction_summary`); then both sweeps' wall times."""
    a, b = (dataset(x) for x in REPRODUCTION[:2])
    default = a.attrs["corr_default_variant"]
    ok, fam = a["status"].values.astype(str) == "ok", a["family"].values.astype(str)
    mp = a["mp"].values.astype(float)
    horizon = max(first_spec(a)["eval"]["lengths"])
    dep, aff = mp[ok & (fam == "state-dependent")], mp[ok & (fam == "affine")]
    if dep.size and aff.size and np.all(dep >= horizon):
        within = family_correlation(a, default, "affine")
        split = (f"**Caveats.** `{default}`'s r = {paired(_r(a, default, 'replace'))} under 'replace' is mostly "
                 f"the split between the families: the state-dependent cells' {dep.size} learned runs all pass "
                 f"every length to {horizon}, so their mp is censored and their own r is undefined "
                 f"({int(a['corr_n_both_censored'])} runs have T_cross and mp both censored). Within the "
                 f"{aff.size} learned runs of the affine cells (mp {aff.min():.0f}–{aff.max():.0f}, median "
                 f"{np.median(aff):.0f}) `{default}` gives r = {_ci(within, 'replace')} ('replace') and "
                 f"{_ci(within, 'drop')} over its {int(within['n']['drop'])} uncensored runs ('drop'). "
                 + _describes(a, default))
    else:
        n_drop = int(a["corr_n"].sel(variant=default, censoring="drop"))
        split = (f"**Caveats.** Under 'drop', among the {n_drop} uncensored runs alone `{default}` still gives "
                 f"r = {paired(_r(a, default, 'drop'))}.")
    lit = [(_r(a, "q", c), _r(a, "q", c, "_lo"), _r(a, "q", c, "_hi")) for c in ("replace", "drop")]
    literal = (f"The paper's literal q gives r = {paired(lit[0][0])} / {paired(lit[1][0])} (replace / drop)"
               + (", both CIs containing 0: it predicts nothing here." if all(lo <= 0 <= hi for _, lo, hi in lit)
                  else "."))
    rep = reproduction_summary(a, b)
    d = rep["max_learned_diff"]
    learned = ("the same learned count in every cell" if d == 0 else
               f"learned counts within {_NUMBER_WORDS.get(d, d)} run{'s' if d != 1 else ''} per cell")
    held = float(b["corr_heldout_pearson_r"])
    if rep["moved"]:
        arch, group, med_a, med_b = rep["example"]
        moved = (f"the per-seed mp moved only in the cells of {join_and(rep['moved_archs'])}, in {rep['moved']} of "
                 f"their {rep['moved_of']} runs learned in both ({arch} on {group}: median {med_a:.0f} → {med_b:.0f})")
    else:
        moved = "every per-seed mp was the same"
    across = (f"**What reproduces across machines:** the same sweep with the torch loops in place of the compiled "
              f"C loops (`DYNLAB_C_KERNELS=0`, rounding-level differences, as between CPU types) gave the same "
              f"status in {rep['same_status']} of {rep['runs']} runs, {learned}, `{default}` r = "
              f"{paired(_r(b, default, 'replace'))} / {paired(_r(b, default, 'drop'))} (replace / drop) and "
              f"held-out r = {paired(held)}; {moved}: quote counts, medians and correlations (per-seed values: "
              "`docs/results.md`; all variants, Spearman ρ, the nonlinearity ablation: `docs/results-paper-a.md`).")
    if (DATA / f"{CROSS_CPU[1]}.nc").is_file():
        cpu = reproduction_summary(a, dataset(CROSS_CPU[1]))
        across += (f" Trained again on an {CROSS_CPU[3]}-only CPU (the committed sweep: {CROSS_CPU[2]}), the "
                   f"same status in {cpu['same_status']} of {cpu['runs']} runs, "
                   + ("every per-seed mp of the runs learned on both the same" if not cpu["moved"] else
                      f"per-seed mp moved in {cpu['moved']} of {cpu['moved_of']} runs learned on both")
                   + " (`docs/results.md`).")
    wall = (f"Wall times, from each dataset's `study_wall_time_s`: the C-loops sweep: {wall_time(a)}; "
            f"the torch-loops sweep: {wall_time(b)}.")
    return prose(f"{split} {literal} {across} {wall}")
