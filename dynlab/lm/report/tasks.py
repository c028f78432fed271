"""Markdown tables of the task studies (copying, passkey, babilong): status, accuracy per test length and arm, paired contrasts."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.errors import DynlabInputError
from dynlab.report.format import fmt_number, fmt_p, machine_line, spread_text, status_line

__all__ = ["TASK_STUDIES", "arm_in_range", "headline", "headline_contrasts", "task_tables"]


TASK_STUDIES = ("copying", "passkey", "babilong")


def headline(ds: xr.Dataset) -> xr.DataArray:
    """The accuracy as (run, length): passkey averaged over depths, babi kept per kind."""
    acc = ds["accuracy"]
    return acc.mean("depth") if "depth" in acc.dims else acc


def task_tables(ds: xr.Dataset) -> str:
    """Markdown of a task study (module docstring); bAbI gets one table per kind."""
    if "phase" not in ds.coords:
        raise DynlabInputError("dataset has no 'phase' coordinate: it was made before the post-training protocol; "
                               "allowed: a task dataset of this dynlab version (rerun the study)")
    out = [machine_line(ds), "", status_line(ds), ""]
    acc = headline(ds)
    post = np.flatnonzero((ds["phase"].values.astype(str) == "post") & (ds["status"].values.astype(str) == "ok"))
    kinds = [str(k) for k in ds["kind"].values] if "kind" in acc.dims else [None]
    if post.size == 0:
        out += ["No learned model was post-trained: there is no contrast to report. The trained models' accuracy "
                "(column: their training intervention):", ""]
        base = np.flatnonzero((ds["phase"].values.astype(str) == "base") & np.isfinite(acc.values).reshape(
            ds.sizes["run"], -1).any(axis=1))
        for arch in dict.fromkeys(ds["arch"].values.astype(str)[base]):
            for kind in kinds:
                out += _task_table(ds, acc, base, arch, kind, xr.Dataset())
        return "\n".join(out) + "\n"
    contrasts = headline_contrasts(ds)
    for arch in dict.fromkeys(ds["arch"].values.astype(str)[post]):
        for kind in kinds:
            out += _task_table(ds, acc, post, arch, kind, contrasts)
    return "\n".join(out) + "\n"


def headline_contrasts(ds: xr.Dataset) -> xr.Dataset:
    """The paired contrasts of the headline accuracy: the dataset's own, or for passkey
    those of the depth-averaged accuracy (the table's columns), computed once."""
    if "contrast" not in ds.coords:
        return xr.Dataset()
    if "depth" not in ds["contrast_mean"].dims:
        return ds
    from dynlab.analysis.contrasts import paired_contrasts

    return paired_contrasts(ds[["accuracy", "status"]].assign(accuracy=headline(ds)), "accuracy")


def _task_table(ds: xr.Dataset, acc: xr.DataArray, post: np.ndarray, arch: str, kind: str | None,
                contrasts: xr.Dataset) -> list[str]:
    rows = post[ds["arch"].values.astype(str)[post] == arch]
    arms = list(dict.fromkeys(ds["intervention"].values.astype(str)[rows]))
    names = [str(c) for c in contrasts["contrast"].values] if "contrast" in contrasts.coords else []
    title = f"**{arch}**" + (f", {kind}" if kind else "") + (", mean over depths" if "depth" in ds["accuracy"].dims else "")
    head = ["length", *arms, *(f"{c} − zero [95 % CI], p" for c in names)]
    lines = [title, "", "| " + " | ".join(head) + " |", "|" + " --- |" * len(head)]
    train_max = int(ds["train_max"].max())
    for li, length in enumerate(ds["length"].values):
        cells = [f"{int(length)}{' (trained)' if length <= train_max else ''}"]
        for iv in arms:
            sel = rows[ds["intervention"].values.astype(str)[rows] == iv]
            v = acc.isel(run=sel, length=li)
            cells.append(spread_text((v.sel(kind=kind) if kind else v).values))
        for c in names:
            cells.append(_contrast_cell(contrasts, arch, c, li, kind))
        lines.append("| " + " | ".join(cells) + " |")
    return lines + ["", *_in_range_line(ds, rows, arms, train_max)]


def arm_in_range(ds: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    """``(arm_in_range_accuracy, damaged)`` per row of a task dataset: the dataset's own
    variables, or for a dataset made before them the same from its accuracies (the mean
    headline accuracy over the lengths ≤ ``train_max``, over the depths and over every kind
    it holds; damaged: a post-training arm below the attribute ``learned_at``)."""
    if "arm_in_range_accuracy" in ds and "damaged" in ds:
        return ds["arm_in_range_accuracy"].values.astype(float), ds["damaged"].values.astype(float)
    acc = ds["accuracy"]
    inside = acc.where(acc["length"] <= ds["train_max"])
    score = inside.mean([d for d in acc.dims if d != "run"]).values.astype(float)
    post = ds["phase"].values.astype(str) == "post"
    damaged = np.where(post & np.isfinite(score), (score < ds.attrs.get("learned_at", 0.9)).astype(float), np.nan)
    return score, damaged


def _in_range_line(ds: xr.Dataset, rows: np.ndarray, arms: list[str], train_max: int) -> list[str]:
    """One line: each arm's own in-range accuracy and how many of its models were damaged in
    range (:func:`arm_in_range`)."""
    score, damaged = arm_in_range(ds)
    ivs = ds["intervention"].values.astype(str)[rows]
    parts = []
    for iv in arms:
        sel = rows[ivs == iv]
        part = f"{iv} {spread_text(score[sel])}"
        dmg = damaged[sel]
        if np.isfinite(dmg).any():
            part += f" (damaged in {int(np.nansum(dmg))} of {int(np.isfinite(dmg).sum())})"
        parts.append(part)
    learned_at = ds.attrs.get("learned_at", float("nan"))
    return [f"Each model's own in-range accuracy (lengths ≤ {train_max}; damaged: below learned_at "
            f"{learned_at:g}): " + "; ".join(parts) + ".", ""]


def _contrast_cell(contrasts: xr.Dataset, arch: str, contrast: str, li: int, kind: str | None) -> str:
    sel: dict = {"mixer": arch, "contrast": contrast, **({"kind": kind} if kind is not None else {})}
    mean, lo, hi, p = (float(contrasts[f"contrast_{k}"].sel(sel).isel(length=li)) for k in ("mean", "lo", "hi", "p"))
    ci = f" [{fmt_number(lo)}, {fmt_number(hi)}]" if np.isfinite(lo) else ""
    return f"{mean:+.2f}{ci}, p {fmt_p(p)}" if np.isfinite(mean) else "—"
