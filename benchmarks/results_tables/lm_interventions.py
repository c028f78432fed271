"""README's paper-B cells on the post-training interventions where the PPL rises: each arm
against the zero-state control, the arms' order, and what TBTT's post-training reads of the
training text (also docs/results.md's note on the interventions datasets)."""

from __future__ import annotations

import functools

import numpy as np
import xarray as xr

from dynlab.report import holm_contrasts

from results_tables.common import first_spec, minus, seed_range
from results_tables.lm_ppl import rises

#: The interventions datasets (their TBTT arm's coverage of the text goes in their note).
INTERVENTION_LABELS = ("length-generalization-interventions", "length-generalization-interventions-no-conv",
                       "length-generalization-size-interventions")


@functools.lru_cache(maxsize=None)
def _train_tokens_of_text(source: str, val_fraction: float) -> int:
    from dynlab.lm.data.corpus import load_corpus

    return len(load_corpus(source, val_fraction).train)


def tbtt_coverage(ds: xr.Dataset) -> tuple[int, int]:
    """``(read, n)``: the distinct training-text tokens that the TBTT arm's post-training of
    an interventions dataset reads (:func:`dynlab.lm.data.loaders.sequential_tokens_read`: batch ×
    (steps × T_train + 1)) and the training text's tokens (its first spec's corpus)."""
    from dynlab.lm.data.loaders import sequential_tokens_read

    spec = first_spec(ds)
    n = _train_tokens_of_text(spec["data"]["source"], float(spec["data"]["val_fraction"]))
    train = spec["train"]
    steps = int(spec["post"]["steps"]) * int(train.get("accum", 1))  # a step reads accum micro-batches
    return sequential_tokens_read(n, int(train["batch_size"]), int(train["seq_len"]), steps), n


def tbtt_coverage_text(ds: xr.Dataset) -> str:
    """``; TBTT's post-training reads 153,616 of the 4,787,039 training-text tokens (3.2 %)`` ('' without TBTT)."""
    if "tbtt" not in ds["intervention"].values.astype(str):
        return ""
    read, n = tbtt_coverage(ds)
    return f"; TBTT's post-training reads {read:,} of the {n:,} tokens of the training text ({100 * read / n:.1f} %)"



def baseline_text(ds: xr.Dataset, what: str) -> str:
    """``300 steps from WHAT (far/in …, above 1 in k of n seeds s–t) …: `` of an interventions dataset."""
    base = ds["far_in_ratio"].values[(ds["phase"].values.astype(str) == "base")].astype(float)
    steps = first_spec(ds)["post"]["steps"]
    return (f"{steps} steps from {what} (seeds {seed_range(ds['seed'].values)}; far/in {base.mean():.3f}, a rise in "
            f"{rises(base)}) against a zero-state control on the same random windows "
            f"(Holm: over the {len(holm_contrasts(ds))} far and in-range tests of its arms): ")


def _arm_name(arm: str) -> str:
    return "TBTT" if arm == "tbtt" else arm.replace("-", " ")


def intervention_cell(ds: xr.Dataset, arm: str) -> str:
    """README's cell for one arm of the interventions dataset: its far/in ratio, in how many
    seeds it lowered the far PPL below the control's, and the far and in-range PPL contrasts
    (paired t-test p, and Holm's over every arm × {far, in-range}: :func:`holm_contrasts`)."""
    adjusted = holm_contrasts(ds)

    def contrast(prefix: str) -> str:
        c = ds.sel(contrast=arm).isel(mixer=0)
        mean, lo, hi, p = (float(c[f"{prefix}contrast_{k}"]) for k in ("mean", "lo", "hi", "p"))
        return (f"{minus(mean, 2, sign=True)} [{minus(lo)}, {minus(hi)}], p {p:.2g} "
                f"(Holm {adjusted[(prefix, arm)]:.2g})")

    phase, ivs = ds["phase"].values.astype(str), ds["intervention"].values.astype(str)
    post = (phase == "post") & (ds["status"].values.astype(str) == "ok")
    far = ds["ppl_far"].values.astype(float)
    mine, ctrl = (post & (ivs == arm)), (post & (ivs == "zero"))
    inside = ds["ppl_in"].values.astype(float)
    far_of, in_of = dict(zip(ds["seed"].values[ctrl], far[ctrl])), dict(zip(ds["seed"].values[ctrl], inside[ctrl]))
    seeds = ds["seed"].values[mine]
    lower = sum(f < far_of.get(s, np.nan) for s, f in zip(seeds, far[mine]))
    worse = sum(x > 1.1 * in_of.get(s, np.nan) for s, x in zip(seeds, inside[mine]))
    broken = f"; in-range PPL over 1.1× the control's in {worse} of {seeds.size}" if worse else ""
    return (f"far/in {ds['far_in_ratio'].values[mine].mean():.3f}; far PPL lower than the control's in {lower} of "
            f"{seeds.size} seeds, difference {contrast('far_')}; in-range PPL difference {contrast('in_')}{broken}")


def tbtt_batches_text(ds: xr.Dataset) -> str:
    """README's words on what TBTT's post-training reads instead of the control's batches."""
    spec = first_spec(ds)
    read, n = tbtt_coverage(ds)
    b, steps = spec["train"]["batch_size"], spec["post"]["steps"]
    return (f"not the control's batches: {b} runs of {steps} consecutive chunks from fixed places, "
            f"{100 * read / n:.1f} % of the training text, the same in every seed (the other arms: the control's "
            f"random windows over the whole text, as many tokens); ")


def order_cell(ds: xr.Dataset) -> str:
    """README's arm-order cell: each arm's far-PPL contrast with its bootstrap interval over
    seeds, lowest first, and every pair of arms (paired t-test, Holm over the pairs), from
    :func:`dynlab.analysis.contrasts.arm_order`."""
    from dynlab.analysis.contrasts import arm_order

    order = arm_order(ds, "ppl_far")
    arms = ", ".join(f"{_arm_name(r['arm'])} {minus(r['mean'], 2, sign=True)} [{minus(r['lo'])}, {minus(r['hi'])}]"
                     for r in order["arms"])
    pairs = order["pairs"]
    held = [x for x in pairs if x["p_holm"] < 0.05]
    verdict = (f"{len(held)} below 0.05 (" + ", ".join(f"{_arm_name(x['a'])} < {_arm_name(x['b'])}" for x in held)
               + ")" if held else f"none below 0.05, lowest {min(x['p_holm'] for x in pairs):.2g}")
    each = ", ".join(f"{_arm_name(x['a'])} − {_arm_name(x['b'])} {minus(x['mean'], 2, sign=True)} (p {x['p']:.2g})"
                     for x in pairs)
    return (f"far PPL − control, mean [95 % bootstrap CI over seeds, narrower than the t-interval], lowest first: "
            f"{arms}; every pair, paired "
            f"t-test (Holm over the {len(pairs)}: {verdict}): {each}")



#: The post-training arms README's interventions rows show, with paper B's answer for each.
PAPER_B_ARMS = (("state-passing", "much stabler far PPL (370M–1.3B, its Fig. 5)"),
                ("tbtt", "close to state passing"),
                ("fitted-noise", "clear gain at 370M and 780M, not at 1.3B"),
                ("random-noise", "limited gain at 370M, none at 780M and 1.3B"))


def intervention_rows(arms: xr.Dataset, other: xr.Dataset | None) -> list[tuple[str, str, str]]:
    """README's rows ``(claim, paper B, dynlab)`` for the interventions dataset ``arms`` (the
    quick model with its convolution) and ``other`` (without it, when committed): one row per
    arm of :data:`PAPER_B_ARMS` that ran, then the arms' order."""
    rows = []
    where, where_other = baseline_text(arms, "the quick model with its convolution"), (
        baseline_text(other, "the quick model without it") if other is not None else "")
    for arm, paper in PAPER_B_ARMS:
        if arm in arms["contrast"].values.astype(str):
            cell = f"{where}{tbtt_batches_text(arms) if arm == 'tbtt' else ''}{intervention_cell(arms, arm)}"
            if other is not None and arm in other["contrast"].values.astype(str):
                cell += f"; {where_other or 'without the convolution: '}{intervention_cell(other, arm)}"
            rows.append((f"{arm.replace('-', ' ')}, post-trained where the PPL rises (preset `interventions`)",
                         paper, cell))
            where = where_other = ""
    order = order_cell(arms) + (f"; without the convolution: {order_cell(other)}" if other is not None else "")
    rows.append(("the arms' order, post-trained where the PPL rises (preset `interventions`)",
                 "state passing ≈ TBTT > fitted noise > random noise", order))
    return rows
