"""README's paper-B table: one short verdict per claim, each drawn from the committed
datasets by a stated rule, with a number or two where it decides; the full numbers of every
claim are docs/results.md's "Paper B's claims in detail" (:mod:`results_tables.paper_b`).

The rules, the same for every row: a rise is a far/in PPL ratio above
:data:`~dynlab.lm.report.tables.RISE` and "rises" means in a majority of seeds; a contrast "holds"
when its Holm-adjusted p (over the family its dataset tests) is below 0.05 (a task contrast,
tested alone at the longest length, when its own p is; bAbI's, Holm over its arms × kinds)."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.analysis.contrasts import holm
from dynlab.report import arm_in_range, far_in_ratio, headline_contrasts, holm_contrasts
from dynlab.lm.report.tables import RISE, size_grid

from results_tables.common import DATA, dataset, first_spec, join_and, minus, prose, seed_range
from results_tables.lm_interventions import PAPER_B_ARMS, _arm_name
from results_tables.lm_ppl import annealed_holds, annealed_judgement, most_rise, ratio_stats, with_annealed
from results_tables.paper_b import MIXER_NAMES
from results_tables.tasks import _arm_mean, _learned

#: The dataset of the ``size-annealed`` preset: the size map's rises trained alone.
ANNEALED = "length-generalization-size-annealed"

#: The significance level of every verdict (after Holm where a family is tested).
ALPHA = 0.05


def rise_verdict(lg: xr.Dataset, lg0: xr.Dataset) -> str:
    """Does the PPL rise beyond T_train from the zero state (with and without the convolution)?"""
    def one(ds: xr.Dataset) -> tuple[bool, str]:
        r = far_in_ratio(ds).values[ds["intervention"].values.astype(str) == "zero"].astype(float)
        stats, _, _ = ratio_stats(ds, "zero")
        return most_rise(r), f"in {int((r > RISE).sum())} of {r.size} seeds (far/in {stats})"
    yes, text = one(lg)
    yes0, text0 = one(lg0)
    return (f"{'yes' if yes else 'no'}: a rise {text}; without the convolution "
            f"{'a rise' if yes0 else 'no rise'} {text0}")


def size_verdict(ds: xr.Dataset, annealed: xr.Dataset | None = None) -> str:
    """Does the rise grow with the training budget?  Read from the checkpoints of one 32× run
    per size and T_train: does a size rise (in most seeds, at some T_train) at the largest
    budget, at which budgets inside the run do sizes rise, and do those rises hold in runs
    trained alone to the budget (``annealed``: the ``size-annealed`` preset's dataset)?"""
    g = size_grid(ds)
    v = g["inrun"]
    top = float(v["budget"].max())

    where, at_top = [], []
    for d in g["d_model"].values:
        x = v.sel(d_model=d)
        budgets = [float(b) for b in x["budget"].values
                   if any(most_rise(x.sel(budget=b, train_length=t)) for t in x["train_length"].values)]
        if budgets:
            where.append(f"width {int(d)} at {join_and([f'{b:g}×' for b in budgets])}")
        if top in budgets:
            at_top.append(f"width {int(d)}")
    last = v.sel(budget=top).values.astype(float)
    head = (f"in part: at {top:g}× {join_and(at_top)} rise" if at_top
            else f"no: at {top:g}×, the largest budget, no size rises (every seed ≤ {np.nanmax(last):.3f})")
    if not where:
        return f"{head}; no checkpoint of the run rises"
    return f"{head}; inside the run most seeds rise: {'; '.join(where)}{_annealed_text(ds, annealed)}"


def _annealed_text(size: xr.Dataset, annealed: xr.Dataset | None) -> str:
    """How many of the in-run rises hold when the budget is trained alone (annealed)."""
    both = with_annealed(size, annealed)
    rows = annealed_judgement(both)
    if not rows:
        return " (checkpoints, not annealed runs)"
    inrun = size_grid(both)["inrun"]
    n_rises = int(((inrun > RISE).sum("seed") * 2 > inrun.sizes["seed"]).sum())
    held: dict[tuple[int, int], list[str]] = {}
    for d, t, b in annealed_holds(rows):
        held.setdefault((d, t), []).append(f"{b:g}×")
    said = "; ".join(f"width {d}, T {t}: {join_and(bs)}" for (d, t), bs in held.items())
    alone = (f"each of these {n_rises} (width, T_train, budget) rises was also trained alone to its budget" if len(rows) == n_rises
             else f"of these {n_rises} (width, T_train, budget) rises, {len(rows)} were also trained alone to their budget")
    return (f"; {alone} (annealed): most seeds rise alone in {sum(map(len, held.values()))}"
            + (f" ({said})" if held else ""))


def context_verdict(ds: xr.Dataset) -> str:
    """Do shorter training contexts fail sooner?  Per model size, the T_train whose seeds rise
    in a majority; "consistent" when each size's rising contexts are its shortest ones and
    some size rises at a context but not at a longer one."""
    ok = ds["status"].values.astype(str) == "ok"
    lengths = sorted({int(x) for x in ds["train_length"].values[ok]})
    parts, prefix, graded = [], True, False
    for n in sorted({int(x) for x in ds["n_params"].values[ok]}):
        up = [t for t in lengths if most_rise(ds["far_in_ratio"].values[
            ok & (ds["n_params"].values == n) & (ds["train_length"].values == t)].astype(float))]
        prefix &= up == lengths[:len(up)]
        graded |= 0 < len(up) < len(lengths)
        said = "every T_train" if up == lengths else (f"T_train {join_and([str(t) for t in up])}" if up else "none")
        parts.append(f"{n:,} parameters rise at {said}")
    word = "consistent" if prefix and graded else "not shown"
    return f"{word}: {'; '.join(parts)} ({lengths[0]}–{lengths[-1]} tested)"


def removes_verdict(lg: xr.Dataset, lg0: xr.Dataset) -> str:
    """Does training with state passing remove the rise (where the zero-state baseline rises)?"""
    def seeds_up(ds: xr.Dataset, arm: str) -> tuple[int, int]:
        r = far_in_ratio(ds).values[ds["intervention"].values.astype(str) == arm].astype(float)
        return int((r > RISE).sum()), r.size

    (up, n), (base_up, base_n) = seeds_up(lg, "state-passing"), seeds_up(lg, "zero")
    stats, _, _ = ratio_stats(lg, "state-passing")
    stats0, _, _ = ratio_stats(lg0, "state-passing")
    word = "nothing to remove" if base_up * 2 <= base_n else "yes" if up == 0 else "no"
    return (f"{word}: far/in {stats} ({up} of {n} seeds above {RISE}; the zero-state baseline {base_up} of "
            f"{base_n}); {stats0} without the convolution")


def _arm_text(ds: xr.Dataset, arm: str) -> str:
    """The verdict on one post-training arm against the zero-state control: its far-PPL
    difference (yes: lower after Holm; no, the opposite: higher after Holm; else not shown)
    and its in-range cost when that holds after Holm."""
    holm = holm_contrasts(ds)
    c = ds.sel(contrast=arm).isel(mixer=0)
    far_p, in_p = holm.get(("far_", arm), np.nan), holm.get(("in_", arm), np.nan)
    far, inside = float(c["far_contrast_mean"]), float(c["in_contrast_mean"])
    word = ("yes" if far < 0 and far_p < ALPHA else "no, the opposite" if far > 0 and far_p < ALPHA
            else "not shown")
    text = f"{word}: far PPL {minus(far, 2, sign=True)}{'' if far_p < ALPHA else ', not significant'} (Holm p {far_p:.2g})"
    if inside > 0 and in_p < ALPHA:
        text += f", at an in-range cost of {minus(inside, 2, sign=True)} (Holm p {in_p:.2g})"
    return text


def arm_verdict(ds: xr.Dataset, other: xr.Dataset | None, arm: str) -> str:
    """Does post-training with ``arm`` lower the far PPL where it rises (with the convolution,
    and without it when that dataset is committed), and at what in-range cost?"""
    out = _arm_text(ds, arm)
    if other is not None and arm in other["contrast"].values.astype(str):
        out += f"; without the convolution (seeds {seed_range(other['seed'].values)}) {_arm_text(other, arm)}"
    return out


#: Paper B's order of the arms, best (lowest far PPL) first; arms of one rank it finds alike.
PAPER_B_RANK = {"state-passing": 0, "tbtt": 0, "fitted-noise": 1, "random-noise": 2}


def order_verdict(ds: xr.Dataset) -> str:
    """Is paper B's order of the arms shown?  Each pair of arms whose far PPL differs after
    Holm over all pairs, said as agreeing with :data:`PAPER_B_RANK` or contradicting it."""
    from dynlab.analysis.contrasts import arm_order

    order = arm_order(ds, "ppl_far")
    pairs = order["pairs"]
    held = [x for x in pairs if x["p_holm"] < ALPHA]
    if not held:
        return (f"not shown: no pair of arms differs after Holm (lowest Holm p {min(x['p_holm'] for x in pairs):.2g}); "
                f"means, lowest far PPL first: {', '.join(_arm_name(r['arm']) for r in order['arms'])}")
    said = []
    for x in held:
        low, high = (x["a"], x["b"]) if x["mean"] < 0 else (x["b"], x["a"])
        agrees = PAPER_B_RANK.get(low, 9) < PAPER_B_RANK.get(high, 9)
        said.append(f"{_arm_name(low)} has a lower far PPL than {_arm_name(high)} "
                    f"({'agrees' if agrees else 'contradicts paper B'}, Holm p {x['p_holm']:.2g})")
    return "in part: " + "; ".join(said)


def _task_contrast(ds: xr.Dataset, arm: str, length: int) -> tuple[float, float]:
    c = headline_contrasts(ds).sel(mixer=ds["arch"].values[0], contrast=arm, length=length)
    return float(c["contrast_mean"]), float(c["contrast_p"])


def _p(p: float) -> str:
    return f"p {p:.2g}" if np.isfinite(p) else "p — (no spread)"


def copying_verdict() -> str:
    """Does state passing improve copying at 3× the longest training string?  Not shown when
    most of the arm's models lose their in-range accuracy (damage, not a length effect)."""
    label = "copying-seeds20-24" if (DATA / "copying-seeds20-24.nc").is_file() else "copying"
    copy = dataset(label)
    far = 3 * int(copy["train_max"].max())
    zero, sp = _arm_mean(copy, "zero", far), _arm_mean(copy, "state-passing", far)
    diff, p = _task_contrast(copy, "state-passing", far)
    score, damaged = arm_in_range(copy)
    mine = (copy["phase"].values.astype(str) == "post") & (copy["intervention"].values.astype(str) == "state-passing")
    hurt, n = int(np.nansum(damaged[mine])), int(mine.sum())
    numbers = f"{zero:.2f} → {sp:.2f} at {far} letters ({_p(p)}, seeds {seed_range(copy['seed'].values)})"
    if hurt * 2 > n:
        return (f"not shown: the arm is damaged in range ({hurt} of {n} of its models fall below "
                f"{copy.attrs['learned_at']}, mean {np.nanmean(score[mine]):.2f}); {numbers}")
    word = "yes" if diff > 0 and p < ALPHA else "no, the opposite" if diff < 0 and p < ALPHA else "not shown"
    return f"{word}: {numbers}"


def passkey_verdict(ds: xr.Dataset) -> str:
    """Does fitted noise extend passkey retrieval (at the second-longest test length)?"""
    near = int(ds["length"].values[-2])
    farthest = int(ds["length"].values[-1])
    diff, p = _task_contrast(ds, "fitted-noise", near)
    arms = {a: " / ".join(f"{_arm_mean(ds, a, x):.2f}" for x in (near, farthest)) for a in ("zero", "fitted-noise")}
    word = ("yes" if diff > 0 and p < ALPHA else "the paper's sign, not significant" if diff > 0
            else "no, the opposite" if p < ALPHA else "no")
    return f"{word}: {arms['zero']} → {arms['fitted-noise']} at {near} / {farthest} tokens ({_p(p)} at {near})"


#: How much a bAbI kind's accuracy must drop from the training length to the longest test
#: length for the verdict to say it falls with length.
BABI_FALL = 0.1


def babi_verdict(ds: xr.Dataset, kinds: bool) -> str:
    """Does accuracy fall with length (by more than :data:`BABI_FALL`), and does an
    intervention lift it at the longest length (Holm over its arms × kinds)?"""
    learned, trained = _learned(ds)
    if learned == 0:
        return f"no model learned ({learned} of {trained}): no verdict"
    longest, train_max = int(ds["length"].max()), int(ds["train_max"].max())
    names = [str(k) for k in ds["kind"].values] if kinds else ["qa1"]
    zero = {k: (_arm_mean(ds.sel(kind=k), "zero", train_max), _arm_mean(ds.sel(kind=k), "zero", longest)) for k in names}
    falls = [k for k in names if zero[k][1] < zero[k][0] - BABI_FALL]
    tests = [(a, k, *_task_contrast(ds.sel(kind=k), a, longest)) for k in names for a in ("state-passing", "fitted-noise")]
    adjusted = holm([p for *_, p in tests]) if learned >= 2 else np.full(len(tests), np.nan)
    lifted = [f"{_arm_name(a)} on {k}" for (a, k, d, _), h in zip(tests, adjusted) if d > 0 and h < ALPHA]
    fall = (f"accuracy falls with length, by more than {BABI_FALL} ({join_and(falls)}: "
            + ", ".join(f"{zero[k][0]:.2f} → {zero[k][1]:.2f}" for k in falls)
            + f" at {longest // train_max}×)") if falls else f"accuracy holds with length (within {BABI_FALL})"
    lift = (f"lifted significantly by {join_and(lifted)} (Holm over {len(tests)} tests" if lifted
            else f"no intervention lifts it significantly (Holm over {len(tests)} tests")
    return f"{fall}; {lift}; {learned} of {trained} seeds learned)"


#: The dataset of the ``state`` preset: Stuffed Mamba's forget threshold read through paper A's contraction.
STATE = "length-generalization-state"


def state_verdict(ds: xr.Dataset) -> str:
    """The ``state`` map's two pre-registered verdicts (:func:`dynlab.lm.report.forget.state_verdicts`)
    with the numbers that decide them: the thresholds' censoring, the fit's slope interval,
    the runs rising above their cell's T_forget, and the pooled contraction correlation."""
    from dynlab.lm.report.forget import contraction_correlations, forget_fit, forget_grid, forget_thresholds, state_verdicts

    grid = forget_grid(ds)
    th = forget_thresholds(grid)
    verdict = state_verdicts(ds)
    lengths = [int(t) for t in grid["train_length"].values]
    cens = th["censored"].values.astype(str)
    fit = forget_fit(th)
    slope = (f"slope {fit['slope']:.3g} [{fit['slope_lo']:.3g}, {fit['slope_hi']:.3g}] tokens per state entry over "
             f"{fit['n']} uncensored points" if np.isfinite(fit["slope"]) else f"no line to fit ({fit['n']} uncensored points)")
    pooled = next((r for r in contraction_correlations(grid) if r["group"] == "pooled"), None)
    corr = (f"memory horizon / T_train against far/in, pooled ρ {pooled['rho']:+.2f} (Holm p {pooled.get('p_holm', np.nan):.2g})"
            if pooled else "no memory horizons stored")
    none = int((cens == "none").sum())
    return (f"threshold {verdict['threshold']}: T_forget censored below (≤ {lengths[0]} where every run learned) in "
            f"{int((cens == 'below').sum())} and above in {int((cens == 'above').sum())} of {cens.size} (state size, "
            f"seed) cells{f', no run learned in {none}' if none else ''}; {slope}; "
            f"{int(th['later_rises'].sum())} of {int(grid['learned'].sum())} learned runs rise above their T_forget. "
            f"Contraction {verdict['contraction']}: {corr}")


def paper_b_verdicts_section() -> str:
    """README's paper-B table: each claim, paper B's answer and dynlab's short verdict."""
    lg, lg0 = dataset("length-generalization"), dataset("length-generalization-no-conv")
    rows = [("PPL rises beyond the training length from the zero state", "yes (370M–1.3B checkpoints)",
             rise_verdict(lg, lg0))]
    if (DATA / "length-generalization-size.nc").is_file():
        rows.append(("the rise grows with the training budget (preset `size`: 4 sizes, T_train 32 and 128)",
                     "yes, from about 7.5× Chinchilla (its Fig. 3)",
                     size_verdict(dataset("length-generalization-size"),
                                  dataset(ANNEALED) if (DATA / f"{ANNEALED}.nc").is_file() else None)))
    if (DATA / "length-generalization-context.nc").is_file():
        rows.append(("shorter training contexts fail sooner (preset `context`)", "yes; larger models need longer ones "
                     "(its Fig. 2)", context_verdict(dataset("length-generalization-context"))))
    if (DATA / f"{STATE}.nc").is_file():
        rows.append(("a model learns to forget only above a T_train that grows linearly with its state (Stuffed "
                     "Mamba's claim; preset `state`: 4 state sizes × T_train 16–512, pre-registered)",
                     "its own: Mamba-2, states of 10^5–10^6 entries", state_verdict(dataset(STATE))))
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
                 "(Holm within each family of tests; copying and passkey test one contrast); every number is in "
                 "docs/results.md:"), "",
           "| paper B's claim | paper B | dynlab |", "| --- | --- | --- |"]
    return "\n".join(out + [f"| {claim} | {paper} | {ours} |" for claim, paper, ours in rows])
