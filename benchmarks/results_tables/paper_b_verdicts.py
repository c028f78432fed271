"""README's paper-B table: one short verdict per claim, each drawn from the committed
datasets by a stated rule, with a number or two where it decides; the full numbers of every
claim are docs/results.md's "Paper B's claims in detail" (:mod:`results_tables.paper_b`).

The rules, the same for every row: a rise is a far/in PPL ratio above
:data:`~dynlab.report.lm.RISE` and "rises" means in a majority of seeds; a contrast "holds"
when its Holm-adjusted p (over the family its dataset tests) is below 0.05 (a task contrast,
tested alone at the longest length, when its own p is)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.report import arm_in_range, far_in_ratio, headline_contrasts, holm_contrasts
from dynlab.report.lm import RISE, size_grid

from results_tables.common import DATA, dataset, first_spec, join_and, minus, prose, seed_range
from results_tables.lm_interventions import PAPER_B_ARMS, _arm_name
from results_tables.lm_ppl import ratio_stats
from results_tables.paper_b import MIXER_NAMES
from results_tables.tasks import _arm_mean, _learned

#: The significance level of every verdict (after Holm where a family is tested).
ALPHA = 0.05


def _majority(r: np.ndarray) -> bool:
    return int((r > RISE).sum()) * 2 > r.size


def rise_verdict(lg: xr.Dataset, lg0: xr.Dataset) -> str:
    """Does the PPL rise beyond T_train from the zero state (with and without the convolution)?"""
    def one(ds: xr.Dataset) -> tuple[bool, str]:
        r = far_in_ratio(ds).values[ds["intervention"].values.astype(str) == "zero"].astype(float)
        stats, _, _ = ratio_stats(ds, "zero")
        return _majority(r), f"far/in {stats}, {int((r > RISE).sum())} of {r.size} seeds above {RISE}"
    yes, text = one(lg)
    yes0, text0 = one(lg0)
    return f"{'yes' if yes else 'no'}: {text}; without the convolution {'a rise' if yes0 else 'no rise'}, {text0}"


def size_verdict(ds: xr.Dataset) -> str:
    """Does the rise grow with the training budget?  Read from the checkpoints of one 32× run
    per size: the budgets where a majority of seeds rise, and the final budget's seeds."""
    g = size_grid(ds)
    v = g["inrun"]
    top = float(v["budget"].max())
    last = v.sel(budget=top).values.astype(float)
    where = []
    for d in g["d_model"].values:
        x = v.sel(d_model=d)
        budgets = [float(b) for b in x["budget"].values
                   if any(int((x.sel(budget=b, train_length=t) > RISE).sum()) * 2 > x.sizes["seed"]
                          for t in x["train_length"].values)]
        if budgets:
            span = f"{budgets[0]:g}×" if len(budgets) == 1 else f"{budgets[0]:g}×–{budgets[-1]:g}×"
            where.append(f"width {int(d)} at {span}")
    grows = bool((last > RISE).sum() * 2 > last.size)
    head = "yes" if grows else f"no: at {top:g}× no size rises (every seed ≤ {np.nanmax(last):.3f})"
    if not where:
        return f"{head}; no checkpoint of the run rises"
    return f"{head}; rises come and go inside the run ({join_and(where)}; checkpoints, not annealed runs)"


def context_verdict(ds: xr.Dataset) -> str:
    """Do shorter training contexts fail sooner?  Per model size, the T_train whose seeds rise
    in a majority; "consistent" when each size's rising contexts are its shortest ones."""
    ok = ds["status"].values.astype(str) == "ok"
    lengths = sorted({int(x) for x in ds["train_length"].values[ok]})
    parts, prefix = [], True
    for n in sorted({int(x) for x in ds["n_params"].values[ok]}):
        up = [t for t in lengths if _majority(ds["far_in_ratio"].values[
            ok & (ds["n_params"].values == n) & (ds["train_length"].values == t)].astype(float))]
        prefix &= up == lengths[:len(up)]
        said = "every T_train" if up == lengths else (f"T_train {join_and([str(t) for t in up])}" if up else "none")
        parts.append(f"{n:,} parameters rise at {said}")
    return f"{'consistent' if prefix else 'not shown'}: {'; '.join(parts)} ({lengths[0]}–{lengths[-1]} tested)"


def removes_verdict(lg: xr.Dataset, lg0: xr.Dataset) -> str:
    """Does training with state passing remove the rise?"""
    r = far_in_ratio(lg).values[lg["intervention"].values.astype(str) == "state-passing"].astype(float)
    stats, _, _ = ratio_stats(lg, "state-passing")
    stats0, _, _ = ratio_stats(lg0, "state-passing")
    n_up = int((r > RISE).sum())
    return f"{'yes' if n_up == 0 else 'no'}: far/in {stats} ({n_up} of {r.size} seeds above {RISE}; {stats0} without the convolution)"


def _arm_text(ds: xr.Dataset, arm: str) -> tuple[bool, str]:
    """``(far gain holds, words)`` for one post-training arm against the zero-state control."""
    holm = holm_contrasts(ds)
    c = ds.sel(contrast=arm).isel(mixer=0)
    far_p, in_p = holm[("far_", arm)], holm[("in_", arm)]
    far, inside = float(c["far_contrast_mean"]), float(c["in_contrast_mean"])
    holds = far < 0 and far_p < ALPHA
    text = (f"far PPL {minus(far, 2, sign=True)} (Holm p {far_p:.2g})" if holds
            else f"far PPL {minus(far, 2, sign=True)}, not significant (Holm p {far_p:.2g})")
    if inside > 0 and in_p < ALPHA:
        text += f", at an in-range cost of {minus(inside, 2, sign=True)} (Holm p {in_p:.2g})"
    return holds, text


def arm_verdict(ds: xr.Dataset, other: xr.Dataset | None, arm: str) -> str:
    """Does post-training with ``arm`` lower the far PPL where it rises (with the convolution,
    and without it when that dataset is committed), and at what in-range cost?"""
    holds, text = _arm_text(ds, arm)
    out = f"{'yes' if holds else 'not shown'}: {text}"
    if other is not None and arm in other["contrast"].values.astype(str):
        holds0, text0 = _arm_text(other, arm)
        out += f"; without the convolution {'yes' if holds0 else 'not shown'}: {text0}"
    return out


def order_verdict(ds: xr.Dataset) -> str:
    """Is paper B's order of the arms shown (a pair that differs after Holm over all pairs)?"""
    from dynlab.analysis.contrasts import arm_order

    order = arm_order(ds, "ppl_far")
    pairs = order["pairs"]
    held = [x for x in pairs if x["p_holm"] < ALPHA]
    lowest = ", ".join(_arm_name(r["arm"]) for r in order["arms"])
    if not held:
        return (f"not shown: no pair of arms differs after Holm (lowest Holm p {min(x['p_holm'] for x in pairs):.2g}); "
                f"means, lowest far PPL first: {lowest}")
    return "shown in part: " + ", ".join(f"{_arm_name(x['a'])} < {_arm_name(x['b'])}" for x in held)


def _task_contrast(ds: xr.Dataset, arm: str, length: int) -> tuple[float, float]:
    c = headline_contrasts(ds).sel(mixer=ds["arch"].values[0], contrast=arm, length=length)
    return float(c["contrast_mean"]), float(c["contrast_p"])


def copying_verdict() -> str:
    """Does state passing improve copying at 3× the longest training string?"""
    label = "copying-seeds20-24" if (DATA / "copying-seeds20-24.nc").is_file() else "copying"
    copy = dataset(label)
    far = 3 * int(copy["train_max"].max())
    zero, sp = _arm_mean(copy, "zero", far), _arm_mean(copy, "state-passing", far)
    diff, p = _task_contrast(copy, "state-passing", far)
    word = "yes" if diff > 0 and p < ALPHA else "no, the opposite" if diff < 0 and p < ALPHA else "not shown"
    score, damaged = arm_in_range(copy)
    mine = (copy["phase"].values.astype(str) == "post") & (copy["intervention"].values.astype(str) == "state-passing")
    hurt = int(np.nansum(damaged[mine]))
    harm = (f"; in range {hurt} of {int(mine.sum())} of the arm's models fall below {copy.attrs['learned_at']} "
            f"(mean {np.nanmean(score[mine]):.2f})" if hurt else "")
    return f"{word}: {zero:.2f} → {sp:.2f} at {far} letters (p {p:.2g}, seeds {seed_range(copy['seed'].values)}){harm}"


def passkey_verdict(ds: xr.Dataset) -> str:
    """Does fitted noise extend passkey retrieval (at the second-longest test length)?"""
    near = int(ds["length"].values[-2])
    farthest = int(ds["length"].values[-1])
    diff, p = _task_contrast(ds, "fitted-noise", near)
    arms = {a: " / ".join(f"{_arm_mean(ds, a, x):.2f}" for x in (near, farthest)) for a in ("zero", "fitted-noise")}
    word = "yes" if diff > 0 and p < ALPHA else "the paper's sign, not significant" if diff > 0 else "no"
    return f"{word}: {arms['zero']} → {arms['fitted-noise']} at {near} / {farthest} tokens (p {p:.2f} at {near})"


def _lifts(diff: float, p: float) -> bool:
    return diff > 0 and p < ALPHA


def babi_verdict(ds: xr.Dataset, kinds: bool) -> str:
    """Does accuracy fall with length, and does an intervention lift it at the longest length?"""
    learned, trained = _learned(ds)
    if learned == 0:
        return f"no model learned ({learned} of {trained}): no verdict"
    longest, train_max = int(ds["length"].max()), int(ds["train_max"].max())
    names = [str(k) for k in ds["kind"].values] if kinds else ["qa1"]
    falls = [k for k in names if _arm_mean(ds.sel(kind=k), "zero", longest)
             < _arm_mean(ds.sel(kind=k), "zero", train_max) - 0.1]
    lifted = [f"{_arm_name(a)} on {k}" for k in names for a in ("state-passing", "fitted-noise")
              if learned >= 2 and _lifts(*_task_contrast(ds.sel(kind=k), a, longest))]
    fall = (f"accuracy falls with length ({join_and(falls)}: "
            + ", ".join(f"{_arm_mean(ds.sel(kind=k), 'zero', train_max):.2f} → "
                        f"{_arm_mean(ds.sel(kind=k), 'zero', longest):.2f}" for k in falls)
            + f" at {longest // train_max}×)") if falls else "accuracy holds with length"
    lift = f"lifted significantly by {join_and(lifted)}" if lifted else "no intervention lifts it significantly"
    return f"{fall}; {lift} ({learned} of {trained} seeds learned)"


def paper_b_verdicts_section() -> str:
    """README's paper-B table: each claim, paper B's answer and dynlab's short verdict."""
    lg, lg0 = dataset("length-generalization"), dataset("length-generalization-no-conv")
    rows = [("PPL rises beyond the training length from the zero state", "yes (370M–1.3B checkpoints)",
             rise_verdict(lg, lg0))]
    if (DATA / "length-generalization-size.nc").is_file():
        rows.append(("the rise grows with the training budget (preset `size`: 4 sizes, T_train 32 and 128)",
                     "yes, from about 7.5× Chinchilla (its Fig. 3)", size_verdict(dataset("length-generalization-size"))))
    if (DATA / "length-generalization-context.nc").is_file():
        rows.append(("shorter training contexts fail sooner (preset `context`)", "yes; larger models need longer ones "
                     "(its Fig. 2)", context_verdict(dataset("length-generalization-context"))))
    rows.append(("training with state passing removes the rise", "yes", removes_verdict(lg, lg0)))
    if (DATA / "length-generalization-interventions.nc").is_file():
        arms = dataset("length-generalization-interventions")
        other = (dataset("length-generalization-interventions-no-conv")
                 if (DATA / "length-generalization-interventions-no-conv.nc").is_file() else None)
        seeds = seed_range(arms["seed"].values)
        for arm, paper in PAPER_B_ARMS:
            if arm in arms["contrast"].values.astype(str):
                rows.append((f"post-training with {_arm_name(arm)} lowers the far PPL (preset `interventions`, seeds "
                             f"{seeds})", paper,
                             arm_verdict(arms, other, arm)))
        rows.append(("the arms' order", "state passing ≈ TBTT > fitted noise > random noise", order_verdict(arms)))
    rows += [("state passing improves copying at 3× the training length", "yes, 0.27 → 0.47 per character",
              copying_verdict()),
             ("fitted noise extends passkey retrieval", "yes (heatmap)", passkey_verdict(dataset("passkey"))),
             ("bAbI-style accuracy vs length (qa1)", "a figure", babi_verdict(dataset("babilong"), kinds=False))]
    if (DATA / "babilong-kinds.nc").is_file():
        rows.append(("bAbI-style kinds vs length (preset `kinds`)", "a figure",
                     babi_verdict(dataset("babilong-kinds"), kinds=True)))
    model = first_spec(lg)["model"]
    out = [prose(f"Preset `{lg.attrs['preset']}` unless named, seeds {seed_range(lg['seed'].values)}; a tiny "
                 f"{MIXER_NAMES.get(model['mixer'], model['mixer'])} LM ({model['n_layers']} layers, width "
                 f"{model['d_model']}). A rise: far/in PPL above {RISE} in most seeds; a verdict holds at p < {ALPHA} "
                 "(Holm within each preset's tests); every number and seed is in docs/results.md:"), "",
           "| paper B's claim | paper B | dynlab |", "| --- | --- | --- |"]
    return "\n".join(out + [f"| {claim} | {paper} | {ours} |" for claim, paper, ours in rows])
