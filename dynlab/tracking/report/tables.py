"""Markdown tables of the group-tracking study (learned runs, mp, theory, T_cross–mp correlations) and of two runs of one sweep."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.report.format import fmt_number, machine_line
from dynlab.tracking.report.theory import theory_learns

__all__ = ["learned_mp", "reproduction_tables", "tracking_tables"]


def learned_mp(ds: xr.Dataset) -> dict[tuple[str, str], tuple[int, int, np.ndarray]]:
    """Per (arch, group): (learned runs, runs, mp of the learned runs)."""
    arch, group = ds["arch"].values.astype(str), ds["group"].values.astype(str)
    ok = ds["status"].values.astype(str) == "ok"
    mp = ds["mp"].values.astype(float)
    out = {}
    for key in dict.fromkeys(zip(arch, group)):
        rows = (arch == key[0]) & (group == key[1])
        out[key] = (int((rows & ok).sum()), int(rows.sum()), mp[rows & ok])
    return out


def tracking_tables(ds: xr.Dataset) -> str:
    """Markdown of a group-tracking dataset: per architecture × group the learned runs,
    the median and range of their max-pass length mp (the numbers that reproduce across
    machines; per-seed mp of cells at the edge of what they track do not) and whether
    :func:`theory_learns` says the architecture tracks the group, then the
    T_cross–mp correlations (:func:`dynlab.analysis.correlation.format_correlation_report`)."""
    from dynlab.analysis.correlation import format_correlation_report

    out = [machine_line(ds), "", "| architecture | group | learned | mp median (min–max) of the learned runs | theory: tracks it |",
           "| --- | --- | --- | --- | --- |"]
    for (arch, group), (n_ok, n, mp) in learned_mp(ds).items():
        spread = f"{np.median(mp):.0f} ({mp.min():.0f}–{mp.max():.0f})" if mp.size else "—"
        theory = {True: "yes", False: "no", None: "—"}[theory_learns(arch, group)]
        out.append(f"| {arch} | {group} | {n_ok} of {n} | {spread} | {theory} |")
    corr = format_correlation_report(ds)
    return "\n".join(out + ["", corr] if corr else out) + "\n"


def reproduction_tables(a: xr.Dataset, b: xr.Dataset, label_a: str, label_b: str) -> str:
    """What two runs of the same sweep share: the runs matched by ``run_id``; statuses,
    learned counts and mp medians per architecture × group, per-seed mp, and the
    correlations of every crossing-time variant."""
    ids_a, ids_b = list(a["run_id"].values.astype(str)), list(b["run_id"].values.astype(str))
    common = [r for r in ids_a if r in set(ids_b)]
    ia, ib = [ids_a.index(r) for r in common], [ids_b.index(r) for r in common]
    a, b = a.isel(run=ia), b.isel(run=ib)
    same_status = int((a["status"].values.astype(str) == b["status"].values.astype(str)).sum())
    both = (a["status"].values.astype(str) == "ok") & (b["status"].values.astype(str) == "ok")
    mp_a, mp_b = a["mp"].values.astype(float)[both], b["mp"].values.astype(float)[both]
    same_mp = int(np.sum(mp_a == mp_b))
    out = [f"{len(common)} runs in both; status the same in {same_status}; among the {int(both.sum())} learned in both, "
           f"mp identical in {same_mp}" + (f", |log₂ mp ratio| median {np.median(np.abs(np.log2(mp_a / mp_b))):.2f}, "
                                           f"max {np.max(np.abs(np.log2(mp_a / mp_b))):.2f}" if both.any() else "") + ".", "",
           f"| architecture | group | learned ({label_a} / {label_b}) | mp median ({label_a} / {label_b}) | per-seed mp equal |",
           "| --- | --- | --- | --- | --- |"]
    la, lb = learned_mp(a), learned_mp(b)
    arch, group = a["arch"].values.astype(str), a["group"].values.astype(str)
    for key in la:
        rows = both & (arch == key[0]) & (group == key[1])
        eq = int(np.sum(a["mp"].values[rows] == b["mp"].values[rows]))
        med = lambda m: f"{np.median(m):.0f}" if m.size else "—"  # noqa: E731
        out.append(f"| {key[0]} | {key[1]} | {la[key][0]} / {lb[key][0]} of {la[key][1]} | "
                   f"{med(la[key][2])} / {med(lb[key][2])} | {eq} of {int(rows.sum())} |")
    if "corr_r" in a and "corr_r" in b:
        out += ["", f"| variant | censoring | r ({label_a}) | r ({label_b}) |", "| --- | --- | --- | --- |"]
        for v in a["variant"].values:  # a variant the other dataset lacks (added later) reads "—"
            for c in ("replace", "drop"):
                ra, rb = (float(d["corr_r"].sel(variant=v, censoring=c)) if v in d["variant"].values else np.nan
                          for d in (a, b))
                out.append(f"| {v} | {c} | {fmt_number(ra)} | {fmt_number(rb)} |")
        ha, hb = (float(d["corr_heldout_pearson_r"]) if "corr_heldout_pearson_r" in d else np.nan for d in (a, b))
        out += ["", f"held-out r of the default variant: {fmt_number(ha)} ({label_a}), {fmt_number(hb)} ({label_b})"]
    return "\n".join(out) + "\n"
