"""Markdown tables of the length-generalization study: far/in PPL ratios, Definition 3.2 verdicts,
budget, context and intervention presets (contrasts with Holm's p, the arms' order, what TBTT reads)."""

from __future__ import annotations

import math

import numpy as np
import xarray as xr

from dynlab.report.format import fmt_number, fmt_p, machine_line, spread_text

__all__ = ["RISE", "arm_order_lines", "budget_tables", "context_tables", "far_in_ratio", "first_rise", "holm_contrasts",
           "intervention_tables", "last_rise", "lm_tables", "alone_rows", "size_grid", "size_tables", "tbtt_line"]


def far_in_ratio(ds: xr.Dataset) -> xr.DataArray:
    """Per run: mean binned PPL over the last eighth of the evaluation length, divided by
    p* (``lg_p_star``, the lowest binned PPL within the training length). 1 = no rise.
    The dataset's own ``far_in_ratio`` where it has one, else computed by
    :func:`dynlab.lm.analysis.metrics.ppl_ranges` (from ``ppl_binned``, ``lg_p_star`` and
    ``train_length``, which every LM study dataset holds)."""
    if "far_in_ratio" in ds:
        return ds["far_in_ratio"]
    from dynlab.lm.analysis.metrics import ppl_ranges

    return ppl_ranges(ds["ppl_binned"], ds["lg_p_star"], ds["train_length"])["far_in_ratio"]


def _ratio_cell(r: np.ndarray, digits: int = 3) -> str:
    """``mean ± sd (above 1 in k of n)`` of far/in ratios over seeds."""
    r = np.asarray(r, dtype=float)
    r = r[np.isfinite(r)]
    if r.size == 0:
        return "—"
    sd = f" ± {r.std(ddof=1):.{digits}f}" if r.size > 1 else ""
    return f"{r.mean():.{digits}f}{sd} ({int((r > 1).sum())} of {r.size} > 1)"


def first_rise(ds: xr.Dataset) -> tuple[float, float, float, int, int]:
    """Of a budget dataset's ok runs: the geometric mean over the seeds that rose of the first
    budget at which far/in exceeds 1 (``first_rise_budget``), with its 95 % t-interval taken
    on log2 of the budget (the checkpoints form a doubling ladder), how many rose and how
    many ran (``(nan, nan, nan, 0, n)`` when none rose)."""
    ok = ds["status"].values.astype(str) == "ok"
    b = ds["first_rise_budget"].values[ok].astype(float)
    rose = b[np.isfinite(b)]
    if rose.size == 0:
        return math.nan, math.nan, math.nan, 0, int(ok.sum())
    from dynlab.analysis.contrasts import paired_summary

    mean, lo, hi, _ = (2.0 ** np.asarray(x) for x in paired_summary(np.log2(rose)))
    return float(mean), float(lo), float(hi), int(rose.size), int(ok.sum())


def last_rise(ds: xr.Dataset) -> np.ndarray:
    """Per ok run of a budget dataset: the largest budget whose far/in ratio exceeds 1 (NaN: none)."""
    ok = ds["status"].values.astype(str) == "ok"
    ratio = ds["far_in_ratio"].values[ok].astype(float)  # [run, budget]
    budgets = ds["budget"].values.astype(float)
    return np.array([budgets[np.flatnonzero(r > 1)[-1]] if (r > 1).any() else np.nan for r in ratio])


def budget_tables(ds: xr.Dataset) -> str:
    """Markdown of a ``budget`` dataset: per checkpoint budget, the tokens per parameter, the
    in-range and far PPL and the far/in ratio over seeds, then the first budget of a rise."""
    ok = ds["status"].values.astype(str) == "ok"
    out = [machine_line(ds), "",
           "| budget (× Chinchilla) | tokens per parameter | in-range PPL | far PPL | far/in PPL ratio, mean ± sd | "
           "Definition 3.2 passed |", "| --- | --- | --- | --- | --- | --- |"]
    for i, b in enumerate(ds["budget"].values):
        sel = ds.isel(run=np.flatnonzero(ok), budget=i)
        passed = np.asarray(sel["lg_passed"].values, dtype=float)
        out.append(f"| {float(b):g} | {spread_text(sel['tokens_per_param'].values, 0)} | {spread_text(sel['ppl_in'].values)} | "
                   f"{spread_text(sel['ppl_far'].values)} | {_ratio_cell(sel['far_in_ratio'].values)} | "
                   f"{int(np.nansum(passed))} of {int(np.isfinite(passed).sum())} |")
    mean, lo, hi, rose, n = first_rise(ds)
    ci = f" [{lo:.2g}, {hi:.2g}]" if np.isfinite(lo) else ""
    last = last_rise(ds)
    line = (f"First budget with far/in > 1: {mean:.2g}×{ci} (geometric mean and 95 % t-interval over the {rose} "
            f"of {n} seeds that rose); the last budget above 1 per seed: "
            + ", ".join("none" if not np.isfinite(x) else f"{x:g}×" for x in last) + "."
            if rose else f"No seed's far/in ratio exceeded 1 at any budget (0 of {n}).")
    return "\n".join(out + ["", line]) + "\n"


def context_tables(ds: xr.Dataset) -> str:
    """Markdown of a ``context`` dataset: the far/in PPL ratio per model size and training length."""
    ok = ds["status"].values.astype(str) == "ok"
    out = [machine_line(ds), "",
           "| parameters | training length | training tokens | in-range PPL | far PPL | far/in PPL ratio, mean ± sd |",
           "| --- | --- | --- | --- | --- | --- |"]
    sizes = sorted({int(x) for x in ds["n_params"].values[ok]})
    for n in sizes:
        for length in sorted({int(x) for x in ds["train_length"].values[ok]}):
            rows = np.flatnonzero(ok & (ds["n_params"].values == n) & (ds["train_length"].values == length))
            if rows.size == 0:
                continue
            sel = ds.isel(run=rows)
            tokens = _train_tokens(ds, rows[0])
            out.append(f"| {n:,} | {length} | {tokens:,} | {spread_text(sel['ppl_in'].values)} | "
                       f"{spread_text(sel['ppl_far'].values)} | {_ratio_cell(sel['far_in_ratio'].values)} |")
    return "\n".join(out) + "\n"


def _train_tokens(ds: xr.Dataset, run: int) -> int:
    """Training tokens of run ``run`` (its spec's steps × batch × length)."""
    import json

    train = json.loads(ds.attrs["specs_json"])[int(run)]["fields"]["train"]
    return int(train["steps"] * train.get("accum", 1) * train["batch_size"] * train["seq_len"])


def intervention_tables(ds: xr.Dataset) -> str:
    """Markdown of a dataset with post-training arms: per arm its in-range and far PPL and
    far/in ratio over seeds, and the paired contrasts (arm − zero-state control) of the far
    and the in-range PPL, with Holm's p over the family of every arm × {far, in-range}
    (:func:`~dynlab.analysis.contrasts.holm`): a cure lowers the far PPL without raising the
    in-range one. Then the arms ranked by their far-PPL contrast and every pair of arms
    tested against each other (:func:`arm_order_lines`), and what TBTT reads (:func:`tbtt_line`)."""
    import json

    phase, status = ds["phase"].values.astype(str), ds["status"].values.astype(str)
    ivs = ds["intervention"].values.astype(str)
    out = [machine_line(ds), "",
           "| model | seeds | in-range PPL | far PPL | far/in PPL ratio, mean ± sd | far PPL − zero [95 % CI], p (Holm) | "
           "in-range PPL − zero [95 % CI], p (Holm) |", "| --- | --- | --- | --- | --- | --- | --- |"]
    base = np.flatnonzero((phase == "base") & (status == "ok"))
    pretrained = "init" in json.loads(ds.attrs.get("specs_json", "[{}]"))[0].get("fields", {})
    # a pretrained checkpoint is one model, evaluated alike in every seed: one row of it
    rows = [("the checkpoint (untouched)", base[:1]) if pretrained else ("trained (zero state)", base)]
    rows += [(f"post-trained: {iv}", np.flatnonzero((phase == "post") & (status == "ok") & (ivs == iv)))
             for iv in dict.fromkeys(ivs[phase == "post"])]
    adjusted = holm_contrasts(ds)
    for name, sel in rows:
        if sel.size == 0:
            continue
        part = ds.isel(run=sel)
        arm = name.split(": ")[-1]
        far = _ppl_contrast(ds, "far_", arm, adjusted) if name.startswith("post") and arm != "zero" else "—"
        inside = _ppl_contrast(ds, "in_", arm, adjusted) if name.startswith("post") and arm != "zero" else "—"
        out.append(f"| {name} | {len(sel)} | {spread_text(part['ppl_in'].values)} | {spread_text(part['ppl_far'].values)} | "
                   f"{_ratio_cell(part['far_in_ratio'].values)} | {far} | {inside} |")
    if adjusted:
        out += ["", f"Holm p: over the {len(adjusted)} tests of this table (every arm's far and in-range contrast)."]
    out += arm_order_lines(ds)
    if (line := tbtt_line(ds)):
        out += ["", line]
    return "\n".join(out) + "\n"


def holm_contrasts(ds: xr.Dataset) -> dict[tuple[str, str], float]:
    """Holm's p (:func:`~dynlab.analysis.contrasts.holm`) of every finite far and in-range
    PPL contrast p of the dataset's first mixer, over that family: ``{(prefix, arm): p}``."""
    from dynlab.analysis.contrasts import holm

    keys = [(prefix, str(arm)) for prefix in ("far_", "in_") if f"{prefix}contrast_p" in ds
            for arm in ds["contrast"].values]
    raw = [float(ds[f"{prefix}contrast_p"].sel(contrast=arm).isel(mixer=0)) for prefix, arm in keys]
    return {k: float(p) for k, p in zip(keys, holm(raw)) if np.isfinite(p)}


def _ppl_contrast(ds: xr.Dataset, prefix: str, arm: str, adjusted: dict[tuple[str, str], float] | None = None) -> str:
    """``+d [lo, hi], p, Holm p`` of the paired PPL contrast ``prefix`` (``far_`` or ``in_``) of ``arm``."""
    if f"{prefix}contrast_mean" not in ds or arm not in ds["contrast"].values.astype(str):
        return "—"
    sel = {"contrast": arm}
    mean, lo, hi, p = (float(ds[f"{prefix}contrast_{k}"].sel(sel).isel(mixer=0)) for k in ("mean", "lo", "hi", "p"))
    ci = f" [{fmt_number(lo, 3)}, {fmt_number(hi, 3)}]" if np.isfinite(lo) else ""
    held = (adjusted or {}).get((prefix, arm))
    return f"{mean:+.3f}{ci}, p {fmt_p(p)}" + (f" (Holm {fmt_p(held)})" if held is not None else "")


def arm_order_lines(ds: xr.Dataset) -> list[str]:
    """The arms ranked by their far-PPL contrast with 95 % percentile bootstrap intervals over
    seeds, and a table of every pair (paired t-test of arm a − arm b, Holm over the pairs;
    :func:`~dynlab.analysis.contrasts.arm_order`); empty with fewer than two arms."""
    from dynlab.analysis.contrasts import arm_order

    if "ppl_far" not in ds or len(set(ds["arch"].values.astype(str))) != 1:
        return []
    order = arm_order(ds, "ppl_far")
    if len(order["arms"]) < 2:
        return []
    ranked = "; ".join(f"{r['arm']} {r['mean']:+.3f} [{fmt_number(r['lo'], 3)}, {fmt_number(r['hi'], 3)}]"
                       for r in order["arms"])
    out = ["", f"Arms by far PPL − zero (mean, 95 % percentile bootstrap interval over seeds), lowest first: {ranked}. "
               "Every pair, arm a − arm b over the seeds (paired t-test; Holm over the pairs). With few seeds a "
               "bootstrap interval is narrower than the t-interval (it has no t quantile): the tests decide the order.",
           "",
           "| a − b | far PPL difference [95 % bootstrap CI] | p | Holm p |", "| --- | --- | --- | --- |"]
    out += [f"| {x['a']} − {x['b']} | {x['mean']:+.3f} [{fmt_number(x['lo'], 3)}, {fmt_number(x['hi'], 3)}] | "
            f"{fmt_p(x['p'])} | {fmt_p(x['p_holm'])} |" for x in order["pairs"]]
    return out


def tbtt_line(ds: xr.Dataset) -> str:
    """What TBTT's post-training reads, beside the other arms (from the dataset's first run
    spec; :class:`dynlab.lm.data.loaders.SequentialChunkLoader`); '' without a TBTT arm."""
    import json

    if "tbtt" not in ds["intervention"].values.astype(str) or "specs_json" not in ds.attrs:
        return ""
    fields = json.loads(ds.attrs["specs_json"])[0]["fields"]
    train, post = fields["train"], fields.get("post") or {}
    b, length = int(train["batch_size"]), int(train["seq_len"])
    steps = int(post.get("steps", 0)) * int(train.get("accum", 1))  # a step reads accum micro-batches
    return (f"TBTT does not read the control's batches: it reads {b} runs of {steps} consecutive {length}-token "
            f"chunks, each from the start of one of {b} equal lanes of the training text, the same in every seed; "
            f"the control and the other arms read the same {steps} × {b} random windows, drawn per seed over the "
            "whole text. TBTT and the control read the same number of tokens.")


def lm_tables(ds: xr.Dataset) -> str:
    """Markdown of a length-generalization dataset (module docstring)."""
    ratio = far_in_ratio(ds)
    out = [machine_line(ds), "",
           "| mixer | intervention | seeds | far/in PPL ratio, mean ± sd (range) | p* (in-training PPL) | Definition 3.2 passed |",
           "| --- | --- | --- | --- | --- | --- |"]
    archs = ds["arch"].values.astype(str) if "arch" in ds.coords else np.array(["?"] * ds.sizes["run"])
    ivs = ds["intervention"].values.astype(str)
    for arch in dict.fromkeys(archs):
        for iv in dict.fromkeys(ivs):
            sel = np.flatnonzero((archs == arch) & (ivs == iv))
            if sel.size == 0:
                continue
            r = ratio.isel(run=sel).values.astype(float)
            seeds = ", ".join(str(int(s)) for s in ds["seed"].values[sel])
            sd = f" ± {r.std(ddof=1):.3f}" if r.size > 1 else ""
            passed = int(np.sum(ds["lg_passed"].values[sel].astype(bool)))
            out.append(f"| {arch} | {iv} | {seeds} | {r.mean():.3f}{sd} ({r.min():.3f}–{r.max():.3f}) | "
                       f"{spread_text(ds['lg_p_star'].values[sel])} | {passed} of {sel.size} |")
    return "\n".join(out) + "\n"


#: A far/in ratio (``far_over_in``) above this counts as a rise in the size map (5 % above
#: the in-range PPL); a size "rises" at a budget when every seed does.
RISE = 1.05


def size_grid(ds: xr.Dataset) -> xr.Dataset:
    """A size dataset's ``far_over_in`` on a grid: ``inrun`` (d_model, train_length, seed,
    budget) for the runs evaluated at checkpoints, ``alone`` (d_model, train_length, seed,
    budget) for the runs trained alone to one budget (``annealed``), each present when the
    dataset has such runs, and ``blocks`` per d_model."""
    flags = ds["annealed"].values.astype(bool)
    keep = ds[["far_over_in", "n_params"]]
    dims = ["d_model", "train_length", "seed"]

    def part(sel: np.ndarray) -> xr.Dataset:
        sub = keep.isel(run=np.flatnonzero(sel))
        return sub.reset_coords([c for c in sub.coords if c not in (*dims, "run", "budget")], drop=True)

    grids = []
    if (~flags).any():
        grids.append(part(~flags).set_index(run=dims).unstack("run")["far_over_in"].rename("inrun"))
    if flags.any():
        sub = part(flags)
        own = sub["budget"].values[np.argmax(np.isfinite(sub["far_over_in"].values), axis=1)]
        alone = sub.assign_coords(own=("run", own)).set_index(run=[*dims, "own"]).unstack("run")
        grids.append(alone["far_over_in"].where(alone["own"] == alone["budget"]).max("own").rename("alone"))
    # the union of both grids' widths, lengths, seeds and budgets: a run trained alone where
    # no run has checkpoints (another seed, another T_train) is kept, NaN in the other grid
    out = xr.merge(grids, join="outer", compat="no_conflicts")
    n = ds["n_params"].groupby(ds["d_model"]).first()
    blocks = (n - 2 * 256 * n["d_model"]).sel(d_model=out["d_model"])
    return out.assign_coords(blocks=("d_model", blocks.values.astype(int)))


def _rise_cell(v: np.ndarray) -> str:
    """``mean (k/n)``: mean far/in over seeds and how many exceed :data:`RISE`."""
    v = np.asarray(v, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return ""
    return f"{v.mean():.3f} ({int((v > RISE).sum())}/{v.size})"


def size_tables(ds: xr.Dataset) -> str:
    """Markdown of a ``size`` dataset: far/in (``far_over_in``) per size, training length
    and budget from the in-run checkpoints; the runs trained alone to a budget (each beside
    the checkpoint at that budget inside the longer run, when the dataset holds it) (module
    constants: :data:`RISE`)."""
    g = size_grid(ds)
    budgets = [float(b) for b in g["budget"].values]
    head = " | ".join(f"{b:g}×" for b in budgets)
    out = [machine_line(ds)]
    if "inrun" in g:
        out += ["", f"far PPL / in-range PPL (`far_over_in`), mean over seeds (seeds above {RISE}), by training budget "
                "(× Chinchilla, every parameter counted), from checkpoints inside one run per size and T_train:", "",
                f"| width (block parameters) | T_train | {head} |", "| --- | --- |" + " --- |" * len(budgets)]
        for d in g["d_model"].values:
            for t in g["train_length"].values:
                v = g["inrun"].sel(d_model=d, train_length=t)
                if not np.isfinite(v).any():
                    continue
                cells = " | ".join(_rise_cell(v.sel(budget=b).values) for b in budgets)
                out.append(f"| {int(d)} ({int(g['blocks'].sel(d_model=d)):,}) | {int(t)} | {cells} |")
    if "alone" in g:
        out += alone_rows(g, budgets)
    return "\n".join(out) + "\n"


def alone_rows(g: xr.Dataset, budgets: list[float]) -> list[str]:
    """The size table's rows of the runs trained alone to a budget (its schedule ends there),
    each beside the in-run checkpoint at that budget when the grid holds it (paired over seeds)."""
    inrun = "inrun" in g
    out = ["", "Trained alone to the budget (its schedule ends there)"
           + (" against the checkpoint at that budget inside the longer run (paired over seeds):" if inrun else ":"),
           "", "| width | T_train | budget | alone |" + (" in-run checkpoint | alone − checkpoint |" if inrun else ""),
           "| --- | --- | --- | --- |" + (" --- | --- |" if inrun else "")]
    for d in g["d_model"].values:
        for t in g["train_length"].values:
            for b in budgets:
                a = g["alone"].sel(d_model=d, train_length=t, budget=b).values
                if not np.isfinite(a).any():
                    continue
                row = f"| {int(d)} | {int(t)} | {b:g}× | {_rise_cell(a)} |"
                if inrun:
                    c = g["inrun"].sel(d_model=d, train_length=t, budget=b).values
                    ok = np.isfinite(a) & np.isfinite(c)
                    diff = a[ok] - c[ok]
                    row += (f" {_rise_cell(c)} | {diff.mean():+.3f} (lower alone in {int((diff < 0).sum())} of "
                            f"{diff.size}) |" if ok.any() else " | |")
                out.append(row)
    return out
