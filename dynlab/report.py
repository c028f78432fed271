"""Markdown tables of a study dataset: the numbers a paper prints, read from what was measured.

``dynlab report PATH`` (a study folder or its ``dataset.nc``) prints them, so a results
document regenerates from the datasets instead of being retyped. Every table says which
runs it pools and on what machine they ran (the dataset's attributes).

Supported studies (``ds.attrs["study"]``):

- ``copying``, ``passkey``, ``babilong`` (:func:`task_tables`): the trained models'
  status, then per test length the accuracy of the zero-state control and of each
  post-training arm (mean over the learned seeds, with min–max), and each arm's paired
  difference from the control (mean, 95 % t-interval, paired-t p; see
  :mod:`dynlab.analysis.contrasts`);
- ``length-generalization`` (:func:`lm_tables`): per intervention the far/in PPL ratio —
  the mean binned PPL over the last eighth of the evaluation length divided by p*, the
  lowest binned PPL within the training length — and the Definition 3.2 verdicts.

``dynlab report FILE.json`` reads a benchmark result instead (:func:`bench_tables`):

- a training-throughput file written by ``dynlab bench train --json`` (a ``results``
  list; the quantities are defined in :mod:`dynlab.bench`);
- a run-phases file written by ``benchmarks/bench_run_phases.py --json`` (``preset`` and
  ``rows``; defined in that script's docstring).

``docs/performance.md`` holds these tables for the files in ``benchmarks/results/``
(``benchmarks/make_docs.sh`` writes them; a test checks they still match).

No torch and no plotting: xarray and numpy only.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import xarray as xr

from dynlab import names
from dynlab.errors import DynlabInputError
from dynlab.results.provenance import read_provenance
from dynlab.results.schema import open_dataset

__all__ = ["THEORY", "bench_machine_line", "bench_markdown", "bench_tables", "far_in_ratio", "lm_tables", "machine_line",
           "report", "reproduction_tables", "task_tables", "theory_learns", "tracking_tables"]

TASK_STUDIES = ("copying", "passkey", "babilong")

#: The groups each built-in tracker can track at every length, by its transition's theory
#: (paper A; :attr:`dynlab.names.CellEntry.theory`).
THEORY: dict[str, str] = dict(names.THEORY)


def theory_learns(arch: str, group: str) -> bool | None:
    """Whether :data:`THEORY` says ``arch`` can track ``group`` (a name :func:`dynlab.tracking.groups.get_group`
    parses) at every length; None for an architecture it does not cover (a user's cell)."""
    from dynlab.tracking.groups import get_group

    kind = THEORY.get(arch)
    if kind is None:
        return None
    g = get_group(group)
    if kind == "none":
        return g.order == 1
    if kind == "elementary abelian 2-groups":
        return g.is_abelian() and all(g.element_order(a) <= 2 for a in range(g.order))
    if kind == "abelian groups":
        return g.is_abelian()
    return True


def _fmt(x: float, digits: int = 2) -> str:
    return "—" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def _spread(values: np.ndarray, digits: int = 2) -> str:
    """``mean (min–max)`` over seeds, or the one value."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "—"
    if v.size == 1:
        return _fmt(v[0], digits)
    return f"{_fmt(v.mean(), digits)} ({_fmt(v.min(), digits)}–{_fmt(v.max(), digits)})"


def machine_line(ds: xr.Dataset) -> str:
    """One line naming the study, preset, date and machine recorded in the dataset's attributes."""
    a = ds.attrs
    parts = [f"study `{a.get('study', '?')}`, preset `{a.get('preset', '?')}`"]
    if a.get("created_utc"):
        parts.append(f"made {a['created_utc']}")
    written_by = read_provenance(a).get("written_by") or {}
    if written_by.get("cpu_model"):
        parts.append(f"on {written_by['cpu_model']} ({written_by.get('torch_cpu_capability') or 'CPU'})")
    if written_by.get("torch"):
        parts.append(f"torch {written_by['torch']}")
    if a.get("git_sha"):
        parts.append(f"dynlab {a.get('dynlab_version', '')} @ {str(a['git_sha'])[:10]}")
    return "; ".join(parts)


def _status_line(ds: xr.Dataset) -> str:
    base = ds.isel(run=np.flatnonzero(ds["phase"].values.astype(str) == "base"))
    lines = []
    for arch in dict.fromkeys(base["arch"].values.astype(str)):
        rows = base.isel(run=np.flatnonzero(base["arch"].values.astype(str) == arch))
        st = rows["status"].values.astype(str)
        drawn = rows["train_attempts"].values if "train_attempts" in rows else np.full(rows.sizes["run"], np.nan)
        scores = ", ".join(f"seed {int(s)}: {_fmt(float(a))}" + (f" ({int(n)} models drawn)" if n > 1 else "")
                           for s, a, n in zip(rows["seed"].values, rows["in_range_accuracy"].values, drawn))
        at = ds.attrs.get("learned_at")
        rule = f"; learned at ≥ {float(at):g}" if at is not None and np.isfinite(float(at)) else ""
        lines.append(f"- `{arch}`: {int((st == 'ok').sum())} of {len(st)} trained models learned "
                     f"(in-range accuracy {scores}{rule})")
    return "\n".join(lines)


def headline(ds: xr.Dataset) -> xr.DataArray:
    """The accuracy as (run, length): passkey averaged over depths, babi kept per kind."""
    acc = ds["accuracy"]
    return acc.mean("depth") if "depth" in acc.dims else acc


def task_tables(ds: xr.Dataset) -> str:
    """Markdown of a task study (module docstring); bAbI gets one table per kind."""
    if "phase" not in ds.coords:
        raise DynlabInputError("dataset has no 'phase' coordinate: it was made before the post-training protocol; "
                               "allowed: a task dataset of this dynlab version (rerun the study)")
    out = [machine_line(ds), "", _status_line(ds), ""]
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
            cells.append(_spread((v.sel(kind=kind) if kind else v).values))
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
        part = f"{iv} {_spread(score[sel])}"
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
    ci = f" [{_fmt(lo)}, {_fmt(hi)}]" if np.isfinite(lo) else ""
    return f"{mean:+.2f}{ci}, p {_fmt(p, 3)}" if np.isfinite(mean) else "—"


def far_in_ratio(ds: xr.Dataset) -> xr.DataArray:
    """Per run: mean binned PPL over the last eighth of the evaluation length, divided by
    p* (``lg_p_star``, the lowest binned PPL within the training length). 1 = no rise.
    The dataset's own ``far_in_ratio`` where it has one (:func:`dynlab.analysis.lm_metrics.ppl_ranges`)."""
    if "far_in_ratio" in ds:
        return ds["far_in_ratio"]
    t = ds["t"].values
    last = t.max()
    far = ds["ppl_binned"].where((ds["t"] > last - last / 8) & (ds["t"] <= last)).mean("t")
    return far / ds["lg_p_star"]


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
        out.append(f"| {float(b):g} | {_spread(sel['tokens_per_param'].values, 0)} | {_spread(sel['ppl_in'].values)} | "
                   f"{_spread(sel['ppl_far'].values)} | {_ratio_cell(sel['far_in_ratio'].values)} | "
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
            out.append(f"| {n:,} | {length} | {tokens:,} | {_spread(sel['ppl_in'].values)} | "
                       f"{_spread(sel['ppl_far'].values)} | {_ratio_cell(sel['far_in_ratio'].values)} |")
    return "\n".join(out) + "\n"


def _train_tokens(ds: xr.Dataset, run: int) -> int:
    """Training tokens of run ``run`` (its spec's steps × batch × length)."""
    import json

    train = json.loads(ds.attrs["specs_json"])[int(run)]["fields"]["train"]
    return int(train["steps"] * train["batch_size"] * train["seq_len"])


def intervention_tables(ds: xr.Dataset) -> str:
    """Markdown of a dataset with post-training arms: per arm its in-range and far PPL and
    far/in ratio over seeds, and the paired contrasts (arm − zero-state control) of the far
    and the in-range PPL: a cure lowers the far PPL without raising the in-range one."""
    phase, status = ds["phase"].values.astype(str), ds["status"].values.astype(str)
    ivs = ds["intervention"].values.astype(str)
    out = [machine_line(ds), "",
           "| model | seeds | in-range PPL | far PPL | far/in PPL ratio, mean ± sd | far PPL − zero [95 % CI], p | "
           "in-range PPL − zero [95 % CI], p |", "| --- | --- | --- | --- | --- | --- | --- |"]
    base = np.flatnonzero((phase == "base") & (status == "ok"))
    rows = [("trained (zero state)", base)]
    rows += [(f"post-trained: {iv}", np.flatnonzero((phase == "post") & (status == "ok") & (ivs == iv)))
             for iv in dict.fromkeys(ivs[phase == "post"])]
    for name, sel in rows:
        if sel.size == 0:
            continue
        part = ds.isel(run=sel)
        arm = name.split(": ")[-1]
        far = _ppl_contrast(ds, "far_", arm) if name.startswith("post") and arm != "zero" else "—"
        inside = _ppl_contrast(ds, "in_", arm) if name.startswith("post") and arm != "zero" else "—"
        out.append(f"| {name} | {len(sel)} | {_spread(part['ppl_in'].values)} | {_spread(part['ppl_far'].values)} | "
                   f"{_ratio_cell(part['far_in_ratio'].values)} | {far} | {inside} |")
    return "\n".join(out) + "\n"


def _ppl_contrast(ds: xr.Dataset, prefix: str, arm: str) -> str:
    """``+d [lo, hi], p`` of the paired PPL contrast ``prefix`` (``far_`` or ``in_``) of ``arm``."""
    if f"{prefix}contrast_mean" not in ds or arm not in ds["contrast"].values.astype(str):
        return "—"
    sel = {"contrast": arm}
    mean, lo, hi, p = (float(ds[f"{prefix}contrast_{k}"].sel(sel).isel(mixer=0)) for k in ("mean", "lo", "hi", "p"))
    ci = f" [{_fmt(lo, 3)}, {_fmt(hi, 3)}]" if np.isfinite(lo) else ""
    return f"{mean:+.3f}{ci}, p {_fmt(p, 3)}"


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
                       f"{_spread(ds['lg_p_star'].values[sel])} | {passed} of {sel.size} |")
    return "\n".join(out) + "\n"


def report(path: str | Path) -> str:
    """The Markdown tables of the study dataset at ``path`` (a study folder or a ``.nc`` file),
    or of the benchmark result at ``path`` (a ``.json`` file, :func:`bench_tables`)."""
    p = Path(path).expanduser()
    if p.suffix.lower() == ".json" and not p.is_dir():
        return bench_tables(p)
    ds = open_dataset(p)
    study = ds.attrs.get("study")
    if study in TASK_STUDIES:
        return task_tables(ds)
    if study == "length-generalization":
        if "budget" in ds.dims:
            return budget_tables(ds)
        if "phase" in ds.coords:
            return intervention_tables(ds)
        if "train_length" in ds.coords and np.unique(ds["train_length"].values).size > 1:
            return context_tables(ds)
        return lm_tables(ds)
    if study == "group-tracking":
        return tracking_tables(ds)
    raise DynlabInputError(f"no report for study {study!r}; allowed: "
                           f"{', '.join((*TASK_STUDIES, 'length-generalization', 'group-tracking'))}")


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
                out.append(f"| {v} | {c} | {_fmt(ra)} | {_fmt(rb)} |")
        ha, hb = (float(d["corr_heldout_pearson_r"]) if "corr_heldout_pearson_r" in d else np.nan for d in (a, b))
        out += ["", f"held-out r of the default variant: {_fmt(ha)} ({label_a}), {_fmt(hb)} ({label_b})"]
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------
# Benchmark results (JSON)

_MACHINE_KEYS = (("cpu_model", "CPU {}"), ("cores", "{} cores"), ("torch", "torch {}"),
                 ("created_utc", "recorded {}"), ("date", "recorded {}"))


def bench_machine_line(data: dict) -> str:
    """One line naming the machine a benchmark file records: CPU model, cores (and how many
    the run could use, where fewer), torch version, GPUs and date (from a ``machine`` object,
    :func:`dynlab.results.provenance.machine_record`, or top-level keys), the device and
    thread counts of its rows, and which of these the file does not record."""
    machine = dict(data.get("machine") or {})
    machine.update({k: data[k] for k, _ in _MACHINE_KEYS if data.get(k) is not None and k not in machine})
    parts, missing = [], []
    for key, fmt in _MACHINE_KEYS:
        if machine.get(key) is not None:
            if not (key == "date" and machine.get("created_utc") is not None):
                parts.append(fmt.format(machine[key]))
            if key == "cores" and machine.get("cores_available") not in (None, machine["cores"]):
                parts[-1] += f" ({machine['cores_available']} available to the run)"
            if key == "torch" and machine.get("cuda_devices"):
                parts.append("GPU " + ", ".join(map(str, machine["cuda_devices"])))
        elif key in ("cpu_model", "cores", "torch"):
            missing.append({"cpu_model": "CPU model", "cores": "core count", "torch": "torch version"}[key])
    if machine.get("created_utc") is None and machine.get("date") is None:
        missing.append("date")
    rows = data.get("results") or []
    devices = sorted({str(r["device"]) for r in rows if r.get("device")})
    threads = sorted({int(r["threads"]) for r in rows if r.get("threads") is not None})
    if devices:
        parts.append("device " + ", ".join(devices))
    if threads:
        parts.append(f"{', '.join(map(str, threads))} thread{'s' if threads != [1] else ''}")
    if not parts:
        return "Machine: not recorded in the file (" + ", ".join(missing) + ")."
    line = "Machine: " + "; ".join(parts)
    if missing:
        line += f" ({', '.join(missing)} not recorded in the file)"
    return line + "."


def _kilo(x: float | None) -> str:
    """Model-tokens/s in thousands, thin-space grouped: ``1 065 K``."""
    return "—" if x is None or not np.isfinite(x) else f"{x / 1e3:,.0f} K".replace(",", " ")


def _floor_text(res: dict) -> str:
    threads = str(res.get("threads"))
    if res.get("floor_kind") == "bandwidth":
        bw = (res.get("memory_bandwidth_bytes") or {}).get(threads)
        return (f"`bandwidth`: {_fmt(bw / 1e9, 1) if bw else '—'} GB/s ÷ "
                f"{_fmt(res['bytes_per_token'] / 1e3, 1)} KB per token")
    rate = (res.get("gemm_rate_flops") or {}).get(threads)
    return f"`gemm`: {_fmt(rate / 1e9, 0) if rate else '—'} GFLOP/s ÷ {res['flops_per_token']:,.0f} FLOPs per token".replace(",", " ")


def _train_bench_tables(data: dict) -> list[str]:
    """The Markdown of ``dynlab bench train`` results (``data["results"]``): per setting its
    floor, a table of the methods, then the summary facts."""
    out: list[str] = []
    for res in data["results"]:
        out += [f"**{res['setting']}** (floor {_floor_text(res)}, at {res.get('threads')} threads)", "",
                "| method | models | model-tokens/s | of floor | s per step |",
                "| --- | --- | --- | --- | --- |"]
        for row in res["rows"]:
            step = row.get("seconds_per_step")
            out.append(f"| {row['method']} | {row['models']} | {_kilo(row['tokens_per_s'])} | "
                       f"{_fmt(row['fraction_of_floor'])} | {'—' if step is None else _fmt(step, 3)} |")
        out.append("")
        facts = [f"best dynlab row {_kilo(res.get('best_dynlab_tokens_per_s'))}",
                 f"{_fmt(res.get('speedup_vs_baseline'), 1)}× the baseline",
                 f"{_fmt(res.get('fraction_of_floor'))} of the floor"]
        if res.get("ensemble_vs_solo_per_model") is not None:
            facts.append(f"best ensemble per model {_fmt(res['ensemble_vs_solo_per_model'])}× one model alone")
        pair = res.get("ensemble_large_vs_small")
        if pair:
            facts.append(f"ensemble of {pair['large']} against {pair['small']} per model, paired over "
                         f"{pair['rounds']} rounds: median {_fmt(pair['median'])} "
                         f"({_fmt(pair['min'])}–{_fmt(pair['max'])}; above 1: {pair['large']} is faster)")
        if res.get("skipped"):
            facts.append("skipped: " + ", ".join(map(str, res["skipped"])))
        out += ["- " + "; ".join(facts) + ".", ""]
    return out


def _sec(x: float) -> str:
    """Seconds: one decimal below 10 s, whole seconds above."""
    return _fmt(x, 1 if x < 10 else 0)


def _phases_tables(data: dict) -> list[str]:
    rows = data["rows"]
    steps = sorted({int(r["train_steps"]) for r in rows})
    short = sorted({int(r["short_length"]) for r in rows})
    out = [f"Preset `{data['preset']}`, group {data['group']}, one run per architecture; seconds of wall time.", "",
           f"| architecture | seeds per ensemble | s per step and model at length 60 | training bound "
           f"({', '.join(map(str, steps))} steps) | evaluation | analysis | (evaluation + analysis) / training | "
           f"not learned: training at length {', '.join(map(str, short))} | not learned: analysis | "
           "not learned: ratio |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in rows:
        out.append(f"| {r['arch']} | {r['ensemble']} | {_fmt(r['step_s'], 3)} | {_sec(r['train_s'])} | "
                   f"{_sec(r['eval_s'])} | {_sec(r['analysis_s'])} | {_fmt(r['ratio'])} | "
                   f"{_sec(r['train_s_short'])} | {_sec(r['analysis_s_not_learned'])} | "
                   f"{_fmt(r['ratio_not_learned'])} |")
    h = float(data["total_hours"])
    hours = f"{_fmt(h, 1)} h" if h >= 1 else f"{_fmt(60 * h, 1)} min"
    out += ["", f"- Whole-study bound: {data['runs_per_arch']} runs per architecture on {data['workers']} workers, "
                f"every run trained for all its steps at length 60: {hours}.", ""]
    return out


def bench_tables(path: str | Path) -> str:
    """Markdown tables of a benchmark result file (module docstring), headed by the machine
    line (:func:`bench_machine_line`)."""
    import json

    p = Path(path).expanduser()
    try:
        data = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise DynlabInputError(f"no benchmark file at {str(path)!r}; allowed: a JSON file written by "
                               "`dynlab bench train --json` or benchmarks/bench_run_phases.py") from None
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise DynlabInputError(f"{str(p)!r} is not a readable benchmark JSON file ({type(exc).__name__})") from None
    if not isinstance(data, dict) or not (isinstance(data.get("results"), list) or {"preset", "rows"} <= data.keys()):
        raise DynlabInputError(f"{str(p)!r} is not a benchmark result dynlab knows; allowed: a file written by "
                               "`dynlab bench train --json` or benchmarks/bench_run_phases.py --json")
    return bench_markdown(data)


def bench_markdown(data: dict) -> str:
    """The Markdown of one benchmark result (module docstring): the machine line
    (:func:`bench_machine_line`), then the tables of ``dynlab bench train`` results
    (``data["results"]``, :func:`dynlab.bench.train_payload`; the command prints this) or of a
    run-phases file (``preset`` and ``rows``)."""
    body = _train_bench_tables(data) if isinstance(data.get("results"), list) else _phases_tables(data)
    return "\n".join([bench_machine_line(data), "", *body]).rstrip("\n") + "\n"
