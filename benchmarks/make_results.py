"""Write docs/results.md and README.md's headline tables from the study datasets in
benchmarks/results/datasets/ (``dynlab report`` tables).

Each dataset file is named ``<label>.nc``; ``DATASETS`` says which command made it and what
the table shows. README.md's sections between ``<!-- results:NAME -->`` and
``<!-- /results:NAME -->`` (``NAME`` in :data:`README_SECTIONS`) are rewritten from the same
files (tables and the paragraphs that quote numbers: paper A's caveats and the torch-loops
reproduction, paper B's state statistics, every study's wall time from its dataset's
``study_wall_time_s``); the text around them is kept. Run from the repository root:
``python benchmarks/make_results.py`` (``--check`` compares instead of writing: exit 1 when
docs/results.md or a README section is stale; ``--slim STUDY LABEL`` stores the run-level
variables of a group-tracking study, or a length-generalization study without its
per-position curves, as a dataset).
"""

from __future__ import annotations

import functools
import json
import re
import sys
import textwrap
from pathlib import Path

import numpy as np
import xarray as xr

from dynlab.results.provenance import read_provenance
from dynlab.results.schema import open_dataset
from dynlab.report.lm import RISE, size_grid
from dynlab.report import headline, headline_contrasts, holm_contrasts, learned_mp, arm_in_range, far_in_ratio, \
    report, reproduction_tables

ROOT = Path(__file__).resolve().parents[1]
DATA = ROOT / "benchmarks" / "results" / "datasets"
OUT = ROOT / "docs" / "results.md"
README = ROOT / "README.md"

#: (file label, heading, the command that made it, what to read in it)
DATASETS = [
    ("group-tracking-sweep", "State tracking: T_cross against mp (paper A)",
     "dynlab study group-tracking --models all --preset sweep --executor dask --workers 2",
     "8 architectures × C2, C6, S3 × seeds 0–4; mp and the correlations of every crossing-time variant; "
     "only the variables these tables read are kept in the committed file"),
    ("group-tracking-groups", "State tracking on more groups (preset groups)",
     "dynlab study group-tracking --models all --preset groups --executor dask --workers 2",
     "8 architectures × C2xC2, C4, C2xC4, D4, C12, A4, D6, C2xS3 × seeds 0–2, the budget scaled by the group "
     "(dynlab.train.budget); 'theory' says whether the architecture can track the group at every length"),
    ("length-generalization", "Length generalization: PPL beyond the training length",
     "dynlab study length-generalization --seeds 0,1,2 --interventions zero,state-passing,tbtt --executor dask "
     "--workers 2",
     "far/in PPL ratio > 1 means PPL rises beyond the training length; Definition 3.2 asks PPL(t) ≤ p* "
     "for all t ≥ t* (binned), so bin-to-bin variation of the text alone can fail it"),
    ("length-generalization-no-conv", "Length generalization without the short convolution",
     "the same, Python API: extra={'interventions': ['zero', 'state-passing'], 'model': {'conv_kernel': 0}}",
     "the mixers of dynlab before the convolution (conv_kernel = 0): the comparison that isolates it"),
    ("length-generalization-budget", "PPL rise against the training budget (preset budget)",
     "dynlab study length-generalization --preset budget --executor dask --workers 2",
     "one model per seed trained to 32× its Chinchilla budget (20 tokens per parameter, every parameter counted), "
     "evaluated at 16× T_train from checkpoints inside the run; far/in > 1 means PPL rises beyond T_train"),
    ("length-generalization-size", "PPL rise against budget, model size and context (preset size)",
     "dynlab study length-generalization --preset size --executor dask --workers 2",
     "4 widths (2,670-60,784 block parameters) x T_train 32 and 128 x seeds 0-2, each trained as one stack of its "
     "3 seeds to its largest budget with checkpoints inside the run, and trained alone to 1x and 4x (2x at width 64); "
     "far_over_in divides the far PPL by the mean PPL over (T_train/2, T_train], one reference for every T_train; "
     "widths 8 and 16 and width 32's T_train-32 run and its 1x run trained with the stack's Mamba-2 scan in the "
     "chunked form, the rest in the grouped form (kernels.ssd.grouped: the same function, another rounding)"),
    ("length-generalization-size-interventions", "Interventions where the size map rises (preset size-interventions)",
     "dynlab study length-generalization --preset size-interventions",
     "width 16 (14,460 parameters) trained alone to 4x its Chinchilla budget at T_train 32, where seeds 0-2 of the "
     "size map rose in every seed, on fresh seeds 40-44, then post-trained per intervention with the interventions "
     "preset's recipe unchanged (300 steps, lr 1e-3) against a zero-state control"),
    ("length-generalization-context", "PPL rise against the training context (preset context)",
     "dynlab study length-generalization --preset context --executor dask --workers 2",
     "T_train 16–128 at two model sizes, the same training tokens for every run, each evaluated at 16× its T_train"),
    ("length-generalization-interventions", "Interventions where the PPL rises (preset interventions)",
     "dynlab study length-generalization --preset interventions --executor dask --workers 2",
     "the quick model with its short convolution (its PPL rises beyond T_train) on seeds 5–9, never used to choose "
     "it, post-trained per intervention against a zero-state control on the same random windows (TBTT on its own "
     "consecutive chunks, below the table); contrasts of the far and of the in-range PPL, arm minus control"),
    ("length-generalization-interventions-no-conv", "Interventions from the convolution-free quick model",
     "the same, Python API: seeds (0, 1, 2, 3, 4), extra={'model': {'conv_kernel': 0}}, executor DaskExecutor(workers=1)",
     "the protocol of the interventions preset from the quick model without its short convolution"),
    ("copying", "Copying", "dynlab study copying",
     "per-character accuracy; trained on 1–16 letters, so 48 is 3× the longest training string"),
    ("copying-state128", "Copying with a 4× larger state (capacity check)",
     "the same, Python API: extra={'model': {'d_state': 128}}",
     "does a larger state let state passing help? (same protocol and seeds)"),
    ("passkey", "Passkey retrieval", "dynlab study passkey",
     "whole-key accuracy, mean over the 5 depths; trained on 112–160 tokens, tested to 16×"),
    ("babilong", "bAbI-style questions", "dynlab study babilong",
     "whole-answer accuracy per kind; qa1 decides whether a model learned"),
    ("copying-seeds20-24", "Copying on seeds never used to choose its rules",
     "dynlab study copying --seeds 20,21,22,23,24 --executor dask --workers 2",
     "the quick preset at the current code (the real Mamba block, no MLP) on fresh seeds: its learned fraction"),
    ("passkey-learnability", "Passkey: does the preset's recipe learn on fresh seeds?",
     "dynlab study passkey --seeds 20,21,22,23,24 --lengths 128 --interventions zero --executor dask --workers 2",
     "the quick preset's training rules (warm start, early stop with its confirming check) on seeds never used to "
     "choose them, tested in range only (128 tokens); the zero-state control is its only post-training arm"),
    ("babilong-learnability", "bAbI qa1: does the preset's recipe learn on fresh seeds?",
     "dynlab study babilong --seeds 20,21,22,23,24 --lengths 64 --interventions zero --executor dask --workers 2",
     "the quick preset's rules (up to 3 models per seed, early stop with its confirming check) on seeds never used "
     "to choose them, tested in range only (64 tokens)"),
    ("babilong-kinds-learnability", "bAbI kinds: does the preset's recipe learn on fresh seeds?",
     "dynlab study babilong --preset kinds --seeds 20,21,22,23,24 --lengths 64 --interventions zero --executor dask "
     "--workers 2",
     "the kinds preset's rules (qa1 first, then qa1, qa6, qa7 together) on seeds never used to choose them, tested in "
     "range only"),
    ("babilong-kinds", "bAbI-style questions of three kinds (preset kinds)", "dynlab study babilong --preset kinds",
     "whole-answer accuracy per kind; the mean over qa1, qa6, qa7 decides whether a model learned"),
]

HEADER = """# Results

Generated by `python benchmarks/make_results.py` from the study datasets in
`benchmarks/results/datasets/` (each the `dataset.nc` of the command shown), with
`dynlab report`'s tables; do not edit by hand. Every seed that ran is shown, none was
picked or dropped. A contrast pairs an intervention's post-training arm with the
zero-state control post-trained from the same model for the same steps; `[lo, hi]` is
the 95 % t-interval of the mean paired difference over seeds and `p` the paired t-test.
Models that did not learn (in-range accuracy below `learned_at`, 0.9 in every preset) are in no contrast.
"""


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


def document() -> str:
    parts = [HEADER]
    for label, heading, command, note in DATASETS:
        path = DATA / f"{label}.nc"
        if not path.is_file():
            continue
        if label in INTERVENTION_LABELS:
            note += tbtt_coverage_text(open_dataset(path))
        parts.append(f"## {heading}\n\n`{command}` — {note}.\n\n{report(path)}")
        for pair, what, note in ((REPRODUCTION, "C loops against torch loops", REPRODUCTION_NOTE),
                                 (CROSS_CPU, "two CPU types", CROSS_CPU_NOTE)):
            if label == pair[0] and (DATA / f"{pair[1]}.nc").is_file():
                a, b = (open_dataset(DATA / f"{x}.nc") for x in pair[:2])
                parts.append(f"### What reproduces: {what}\n\n{note}\n\n{reproduction_tables(a, b, *pair[2:])}")
    if (DATA / f"{FRESH_LABEL}.nc").is_file():
        parts.append(f"## {FRESH_HEADING}\n\n`{FRESH_COMMAND}` — {FRESH_NOTE}.\n\n{fixed_points_section()}\n")
    return "\n".join(parts)


#: The interventions datasets (their TBTT arm's coverage of the text goes in their note).
INTERVENTION_LABELS = ("length-generalization-interventions", "length-generalization-interventions-no-conv",
                       "length-generalization-size-interventions")


@functools.lru_cache(maxsize=None)
def _train_tokens_of_text(source: str, val_fraction: float) -> int:
    from dynlab.lm.corpus import load_corpus

    return len(load_corpus(source, val_fraction).train)


def tbtt_coverage(ds: xr.Dataset) -> tuple[int, int]:
    """``(read, n)``: the distinct training-text tokens that the TBTT arm's post-training of
    an interventions dataset reads (:func:`dynlab.lm.loaders.sequential_tokens_read`: batch ×
    (steps × T_train + 1)) and the training text's tokens (its first spec's corpus)."""
    from dynlab.lm.loaders import sequential_tokens_read

    spec = _first_spec(ds)
    n = _train_tokens_of_text(spec["data"]["source"], float(spec["data"]["val_fraction"]))
    train = spec["train"]
    return sequential_tokens_read(n, int(train["batch_size"]), int(train["seq_len"]), int(spec["post"]["steps"])), n


def tbtt_coverage_text(ds: xr.Dataset) -> str:
    """``; TBTT's post-training reads 153,616 of the 4,787,039 training-text tokens (3.2 %)`` ('' without TBTT)."""
    if "tbtt" not in ds["intervention"].values.astype(str):
        return ""
    read, n = tbtt_coverage(ds)
    return f"; TBTT's post-training reads {read:,} of the {n:,} tokens of the training text ({100 * read / n:.1f} %)"


# ---------------------------------------------------------------------------------------------
# README.md's headline tables

#: How README names the LM mixers.
MIXER_NAMES = {"mamba2": "Mamba-2", "mamba1": "Mamba-1", "gla": "GLA"}

#: Crossing-time variants in README's paper-A table, with what each is.
README_VARIANTS = {"q": "paper A's literal R/M", "q_par": "", "q_dec": "trained decoder", "probe": "",
                   "forecast_dec": "fitted inside the training length",
                   "forecast_horizon": "decoder margins drifting inside the training length"}


def _prose(text: str) -> str:
    """A sentence of README prose, wrapped at 90 columns as the hand-written text is."""
    return textwrap.fill(text, width=90, break_long_words=False, break_on_hyphens=False)


def _dataset(label: str) -> xr.Dataset:
    return open_dataset(DATA / f"{label}.nc")


def _first_spec(ds: xr.Dataset) -> dict:
    """The fields of the dataset's first run spec."""
    return json.loads(ds.attrs["specs_json"])[0]["fields"]


def _seeds(values) -> str:
    """``0–4`` for consecutive seeds, else ``0, 2, 5``."""
    s = sorted({int(v) for v in values})
    return f"{s[0]}–{s[-1]}" if len(s) > 1 and s == list(range(s[0], s[-1] + 1)) else ", ".join(map(str, s))


def _minus(x: float, digits: int = 2, sign: bool = False) -> str:
    """``x`` with a typographic minus (and ``+`` when ``sign``)."""
    text = f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    return text.replace("-", "−")


def _paired(x: float, digits: int = 2) -> str:
    """``+0.99`` / ``-0.07`` (the correlation tables' format)."""
    return f"{x:+.{digits}f}"


def paper_a_section() -> str:
    """README's paper-A tables: learned runs and mp per architecture and group, the T_cross–mp
    correlations of :data:`README_VARIANTS`, and the held-out r of the default variant."""
    ds = _dataset("group-tracking-sweep")
    cells = learned_mp(ds)
    archs, groups = list(dict.fromkeys(a for a, _ in cells)), list(dict.fromkeys(g for _, g in cells))
    per_cell = max(n for _, n, _ in cells.values())
    horizon = max(_first_spec(ds)["eval"]["lengths"])
    out = [_prose(f"Preset `{ds.attrs['preset']}`, seeds {_seeds(ds['seed'].values)}, {ds.sizes['run']} runs. "
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
    out += ["", _prose(f"Pearson r between each variant's T_cross and mp over the {n_learned} learned runs, "
                       f"with {float(ds.attrs['ci_level']) * 100:.0f} % bootstrap CIs. Under 'replace' a crossing "
                       "that never happened is set to its run's horizon; 'drop' leaves out every run with T_cross "
                       "or mp censored:"), "",
            "| variant | r, replace | r, drop | n (replace / drop) |", "| --- | --- | --- | --- |"]
    for variant, what in README_VARIANTS.items():
        notes = [n for n in (what, "the default" if variant == default else "") if n]
        r = {c: "{} [{}, {}]".format(*(_paired(float(ds[f"corr_r{k}"].sel(variant=variant, censoring=c)))
                                       for k in ("", "_lo", "_hi"))) for c in ("replace", "drop")}
        n = {c: int(ds["corr_n"].sel(variant=variant, censoring=c)) for c in ("replace", "drop")}
        label = f"`{variant}`" + (f" ({'; '.join(notes)})" if notes else "")
        out.append(f"| {label} | {r['replace']} | {r['drop']} | {n['replace']} / {n['drop']} |")
    held = [_paired(float(ds[f"corr_heldout_pearson_r{k}"])) for k in ("", "_lo", "_hi")]
    out += ["", _prose(f"On held-out seeds {_seeds(json.loads(ds.attrs['corr_heldout_seeds']))} (the default "
                       f"chosen on seeds {_seeds(json.loads(ds.attrs['corr_selection_seeds']))}), `{default}` gives "
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
        r = [_paired(float(ds[f"corr_forecast_heldout_r{k}"].sel(forecast=name, censoring="drop")))
             for k in ("", "_lo", "_hi")]
        return f"r = {r[0]} [{r[1]}, {r[2]}] over {int(ds['corr_forecast_heldout_n'].sel(forecast=name, censoring='drop'))} runs"

    r = float(ds["corr_forecast_heldout_r"].sel(forecast=README_FORECAST, censoring="drop"))
    verdict = "at least" if r >= FORECAST_GOAL else "short of"
    seeds = _seeds(json.loads(ds["corr_forecast_heldout_r"].attrs["heldout_seeds"]))
    return (f" The horizon forecast `{README_FORECAST}` (`T_horizon`, from steps ≤ the training length only; "
            f"docs/error-control.md), defined on seeds 0–1, gives on seeds {seeds} under 'drop' {cell(README_FORECAST)}"
            f" ({verdict} {FORECAST_GOAL}); `forecast_dec` gives {cell('forecast_dec')}.")


def _ratio_stats(ds: xr.Dataset, intervention: str) -> tuple[str, int, int]:
    """``("mean ± sd", seeds with ratio > 1, seeds)`` of the far/in PPL ratio of one intervention."""
    r = far_in_ratio(ds).values[ds["intervention"].values.astype(str) == intervention].astype(float)
    return f"{r.mean():.3f} ± {r.std(ddof=1):.3f}", int((r > 1).sum()), r.size


def budget_cell(ds: xr.Dataset) -> str:
    """README's "PPL rise vs training budget" cell: far PPL / in-range PPL (over (T/2, T], one
    reference for every budget) per checkpoint budget, with the seeds above RISE."""
    ok = ds["status"].values.astype(str) == "ok"
    ratio = (ds["ppl_far"] / ds["ppl_in"]).values[ok].astype(float)  # [run, budget]
    n = int(ok.sum())
    per = ", ".join(f"{float(b):g}× {ratio[:, i].mean():.3f} ({int((ratio[:, i] > RISE).sum())}/{n})"
                    for i, b in enumerate(ds["budget"].values))
    spec = _first_spec(ds)["model"]
    params = int(ds["n_params"].values[ok][0])
    pin = ds["ppl_in"].values[ok].astype(float)
    return (f"{params:,}-parameter Mamba-2 (width {spec['d_model']}, no MLP), T_train "
            f"{int(ds['train_length'].values[0])}, {n} seeds, checkpoints inside one 32× run: far PPL / PPL over "
            f"(T/2, T] (seeds above {RISE}) at {per}; in-range PPL {pin[:, 0].mean():.1f} → {pin[:, -1].mean():.2f}")


def size_cell(ds: xr.Dataset) -> str:
    """README's size-map cell: per width and T_train, the budgets at which every seed rose
    (far_over_in > RISE) and the ratio at the largest budget; then the runs trained alone."""
    g = size_grid(ds)
    parts = []
    for d in g["d_model"].values:
        cells = []
        for t in g["train_length"].values:
            v = g["inrun"].sel(d_model=d, train_length=t)
            if not np.isfinite(v).any():
                continue
            done = v["budget"].values[np.isfinite(v).all("seed").values]
            rose = [f"{b:g}×" for b in done if bool((v.sel(budget=b) > RISE).all())]
            top = float(done.max())
            cells.append(f"T {int(t)}: all seeds rose at {_and(rose) if rose else 'no budget'}, "
                         f"{float(v.sel(budget=top).mean()):.2f} at {top:g}×")
        parts.append(f"width {int(d)} ({int(g['blocks'].sel(d_model=d)):,} block parameters): " + "; ".join(cells))
    alone = ""
    if "alone" in g and 32 in g["train_length"].values:
        a, c = g["alone"], g["inrun"].sel(train_length=32)
        ok = np.isfinite(a.values) & np.isfinite(c.values)
        diff = (a.values - c.values)[ok]
        alone = (f"; trained alone to 1×/4× (2× at width 64) against the checkpoint at that budget: lower in "
                 f"{int((diff < 0).sum())} of {diff.size} runs, mean {diff.mean():+.3f}")
    return f"far/in = far PPL / PPL over (T/2, T] (a rise: > {RISE}) by budget × Chinchilla: " + "; ".join(parts) + alone


def context_cell(ds: xr.Dataset) -> str:
    """README's "PPL rise vs training context" cell: the far/in ratio per size and T_train."""
    ok = ds["status"].values.astype(str) == "ok"
    parts = []
    for n in sorted({int(x) for x in ds["n_params"].values[ok]}):
        cells = []
        for length in sorted({int(x) for x in ds["train_length"].values[ok]}):
            sel = ok & (ds["n_params"].values == n) & (ds["train_length"].values == length)
            r = ds["far_in_ratio"].values[sel].astype(float)
            cells.append(f"{length}: {r.mean():.3f} ({int((r > 1).sum())}/{r.size})")
        parts.append(f"{n:,} parameters: " + ", ".join(cells))
    tokens = _train_tokens_of(ds)
    return f"far/in ratio by T_train (seeds above 1), {tokens:,} training tokens each; " + "; ".join(parts)


def _train_tokens_of(ds: xr.Dataset) -> int:
    train = _first_spec(ds)["train"]
    return int(train["steps"] * train["batch_size"] * train["seq_len"])


def _baseline_text(ds: xr.Dataset, what: str) -> str:
    """``300 steps from WHAT (far/in …, above 1 in k of n seeds s–t) …: `` of an interventions dataset."""
    base = ds["far_in_ratio"].values[(ds["phase"].values.astype(str) == "base")].astype(float)
    steps = _first_spec(ds)["post"]["steps"]
    return (f"{steps} steps from {what} (seeds {_seeds(ds['seed'].values)}; far/in {base.mean():.3f}, above 1 in "
            f"{int((base > 1).sum())} of {base.size}) against a zero-state control on the same random windows "
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
        return (f"{_minus(mean, 2, sign=True)} [{_minus(lo)}, {_minus(hi)}], p {p:.2g} "
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
    spec = _first_spec(ds)
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
    arms = ", ".join(f"{_arm_name(r['arm'])} {_minus(r['mean'], 2, sign=True)} [{_minus(r['lo'])}, {_minus(r['hi'])}]"
                     for r in order["arms"])
    pairs = order["pairs"]
    held = [x for x in pairs if x["p_holm"] < 0.05]
    verdict = (f"{len(held)} below 0.05 (" + ", ".join(f"{_arm_name(x['a'])} < {_arm_name(x['b'])}" for x in held)
               + ")" if held else f"none below 0.05, lowest {min(x['p_holm'] for x in pairs):.2g}")
    each = ", ".join(f"{_arm_name(x['a'])} − {_arm_name(x['b'])} {_minus(x['mean'], 2, sign=True)} (p {x['p']:.2g})"
                     for x in pairs)
    return (f"far PPL − control, mean [95 % bootstrap CI over seeds, narrower than the t-interval], lowest first: "
            f"{arms}; every pair, paired "
            f"t-test (Holm over the {len(pairs)}: {verdict}): {each}")


def _arm_mean(ds: xr.Dataset, intervention: str, length: int) -> float:
    """Mean over seeds of the post-trained arm's headline accuracy at ``length``."""
    acc = headline(ds).sel(length=length)
    post = (ds["phase"].values.astype(str) == "post") & (ds["intervention"].values.astype(str) == intervention)
    return float(acc.values[post].mean())


def _contrast(ds: xr.Dataset, contrast: str, length: int) -> str:
    """``−0.10 [−0.19, 0.00], p 0.05``: the paired contrast against the zero-state control."""
    c = headline_contrasts(ds).sel(mixer=ds["arch"].values[0], contrast=contrast, length=length)
    mean, lo, hi, p = (float(c[f"contrast_{k}"]) for k in ("mean", "lo", "hi", "p"))
    p_text = f"{p:.2f}" if np.isfinite(p) else "— (no spread)"
    return f"{_minus(mean, sign=True) if mean > 0 else _minus(mean)} [{_minus(lo)}, {_minus(hi)}], p {p_text}"


def _learned(ds: xr.Dataset) -> tuple[int, int]:
    """(models that learned, models trained) in the base phase."""
    base = ds["phase"].values.astype(str) == "base"
    return int((ds["status"].values.astype(str)[base] == "ok").sum()), int(base.sum())


def _babi_grid(ds: xr.Dataset) -> tuple[np.ndarray, str, int, list[int]]:
    """A babilong dataset's base-phase rows, their in-range accuracies as text, its longest
    training length and the test lengths the README quotes (1×, 4× and the longest)."""
    base = ds["phase"].values.astype(str) == "base"
    in_range = ", ".join(f"{x:.2f}" for x in ds["in_range_accuracy"].values[base])
    train_max = int(ds["train_max"].max())
    lengths = [x for x in (train_max, 4 * train_max, int(ds["length"].max())) if x in ds["length"].values]
    return base, in_range, train_max, lengths


def _babi_cell(babi: xr.Dataset) -> str:
    """README's bAbI cell: how many models learned qa1, and the qa1 accuracy of each
    post-training arm at the training length, 4× and the longest test length, with the
    paired contrasts at the longest (when ≥ 2 seeds learned)."""
    learned, trained = _learned(babi)
    base, in_range, train_max, lengths = _babi_grid(babi)
    train = _first_spec(babi)["train"]
    steps = f"{train['steps']} steps"
    if train.get("attempts", 1) > 1 and "train_attempts" in babi:
        drawn = babi["train_attempts"].values[base]
        steps += (f" per model, up to {train['attempts']} models per seed; "
                  + ("learned by each seed's first model" if (drawn == 1).all() else
                     "models drawn per seed: " + ", ".join(str(int(x)) for x in drawn)))
    if learned == 0:
        return (f"no model learned qa1 within {steps} (in-range accuracy {in_range}; learned: "
                f"≥ {babi.attrs['learned_at']}), so no contrast")
    qa1 = babi.sel(kind="qa1")
    arms = {a: " / ".join(f"{_arm_mean(qa1, a, x):.2f}" for x in lengths)
            for a in ("zero", "state-passing", "fitted-noise")}
    cell = (f"{learned} of {trained} seeds learned qa1 ({steps}; in-range accuracy {in_range}); qa1 at "
            f"{' / '.join(str(x) for x in lengths)} tokens ({' / '.join(f'{x // train_max}×' for x in lengths)}): "
            f"zero-state control {arms['zero']}, state passing {arms['state-passing']}, fitted noise "
            f"{arms['fitted-noise']}")
    if learned >= 2:
        cell += (f"; at {lengths[-1]}: state passing {_contrast(qa1, 'state-passing', lengths[-1])}, fitted noise "
                 f"{_contrast(qa1, 'fitted-noise', lengths[-1])}")
    return cell + _old_block(babi)


def _babi_kinds_cell(ds: xr.Dataset) -> str:
    """README's bAbI-kinds cell: how many seeds learned every kind, the zero-state control's
    accuracy per kind at the training length, 4× and the longest test length, and each arm's
    paired contrast per kind at the longest (when ≥ 2 seeds learned)."""
    learned, trained = _learned(ds)
    _, in_range, _, lengths = _babi_grid(ds)
    kinds = [str(k) for k in ds["kind"].values]
    if learned == 0:
        return f"no model learned {', '.join(kinds)} (in-range accuracy {in_range}), so no contrast"
    zero = "; ".join(f"{k} " + " / ".join(f"{_arm_mean(ds.sel(kind=k), 'zero', x):.2f}" for x in lengths)
                     for k in kinds)
    chance = ", ".join(f"{k} {float(ds['chance'].sel(kind=k)):.2f}" for k in kinds)
    cell = (f"{learned} of {trained} seeds learned {', '.join(kinds)} (mean in-range accuracy {in_range}); "
            f"zero-state control at {' / '.join(str(x) for x in lengths)} tokens: {zero} (always giving the most "
            f"common answer scores {chance})")
    if learned >= 2:
        for arm in ("state-passing", "fitted-noise"):
            cell += (f"; {arm.replace('-', ' ')} − zero at {lengths[-1]}: "
                     + ", ".join(f"{k} {_contrast(ds.sel(kind=k), arm, lengths[-1])}" for k in kinds))
    return cell + _old_block(ds)


def _old_block(ds: xr.Dataset) -> str:
    """`` (seeds 0–2, with an MLP after each mixer)`` when the dataset's Mamba model predates the real Mamba
    block (``mlp_ratio > 0``, as the task presets trained before the MLP was dropped), else ''."""
    model = _first_spec(ds).get("model") or {}
    old = model.get("mlp_ratio", 0) and str(model.get("mixer", "")).startswith("mamba")
    return f" (seeds {_seeds(ds['seed'].values)}, with an MLP after each mixer)" if old else ""


def copying_cell() -> str:
    """README's copying cell: state passing against the zero-state control at 3× the longest
    training string (on the fresh seeds 20–24 when that dataset exists), each arm's damage
    in range, and the 4×-state capacity check."""
    fresh = (DATA / "copying-seeds20-24.nc").is_file()  # the quick preset at the current block, fresh seeds
    copy, copy4 = _dataset("copying-seeds20-24" if fresh else "copying"), _dataset("copying-state128")
    far = 3 * int(copy["train_max"].max())
    learned, trained = _learned(copy)
    score, damaged = arm_in_range(copy)
    sp_rows = (copy["phase"].values.astype(str) == "post") & (copy["intervention"].values.astype(str) == "state-passing")
    model, model4 = _first_spec(copy)["model"], _first_spec(copy4)["model"]
    state_x = model4["d_state"] / model["d_state"]
    return ((f"seeds {_seeds(copy['seed'].values)}: " if fresh else "")
            + f"{_arm_mean(copy, 'zero', far):.2f} → {_arm_mean(copy, 'state-passing', far):.2f} at {far} letters, "
            f"difference {_contrast(copy, 'state-passing', far)} ({learned} of {trained} models learned); but in "
            f"range (≤ {int(copy['train_max'].max())} letters) the state-passing arm scores "
            f"{np.nanmean(score[sp_rows]):.2f} and {int(np.nansum(damaged[sp_rows]))} of {int(sp_rows.sum())} of its "
            f"models fell below 0.9: damage in range, not a length effect; with a "
            f"{state_x:.0f}× larger state {_arm_mean(copy4, 'zero', far):.2f} → "
            f"{_arm_mean(copy4, 'state-passing', far):.2f}{_old_block(copy4)}")


def paper_b_section() -> str:
    """README's paper-B table: each claim, paper B's answer, and dynlab's numbers."""
    lg, lg0 = _dataset("length-generalization"), _dataset("length-generalization-no-conv")
    passkey, babi = _dataset("passkey"), _dataset("babilong")
    copying = copying_cell()
    model = _first_spec(lg)["model"]
    zero, zero0 = _ratio_stats(lg, "zero"), _ratio_stats(lg0, "zero")
    rise = (f"far/in PPL ratio {zero[0]} (above 1 in {zero[1]} of {zero[2]} seeds); with `conv_kernel = 0`, "
            f"{zero0[0]} ({zero0[1]} of {zero0[2]})")
    sp, sp0, tbtt = _ratio_stats(lg, "state-passing"), _ratio_stats(lg0, "state-passing"), _ratio_stats(lg, "tbtt")
    removes = f"trained with it: ratio {sp[0]} ({sp0[0]} without the convolution); TBTT {tbtt[0]}"
    near, farthest = (int(x) for x in passkey["length"].values[-2:])
    train_max = int(passkey["train_max"].max())
    acc = headline(passkey).sel(length=near)
    post, iv = passkey["phase"].values.astype(str) == "post", passkey["intervention"].values.astype(str)
    fitted, control = acc.values[post & (iv == "fitted-noise")], acc.values[post & (iv == "zero")]
    order = np.argsort(passkey["seed"].values[post & (iv == "fitted-noise")])
    better = int((fitted[order] > control[np.argsort(passkey["seed"].values[post & (iv == "zero")])]).sum())
    arms = {a: " / ".join(f"{_arm_mean(passkey, a, x):.2f}" for x in (near, farthest))
            for a in ("zero", "fitted-noise", "state-passing")}
    passkey_cell = (f"at {near} / {farthest} tokens ({near / train_max:.0f}× / {farthest / train_max:.0f}×) "
                    f"{arms['zero']} → {arms['fitted-noise']}, better in {better} of {fitted.size} seeds at {near}, "
                    f"{_contrast(passkey, 'fitted-noise', near)}; state passing {arms['state-passing']}"
                    f"{_old_block(passkey)}")
    rows = [("PPL rises beyond the training length from the zero state", "yes (370M–1.3B checkpoints)", rise)]
    if (DATA / "length-generalization-budget.nc").is_file() and not (DATA / "length-generalization-size.nc").is_file():
        rows.append(("PPL rise vs training budget (preset `budget`)",  # the size map holds its model (width 16)
                     "rises from about 7.5× the Chinchilla budget, growing with training (Mamba-2 85M, T = 1024; "
                     "its Fig. 3)", budget_cell(_dataset("length-generalization-budget"))))
    if (DATA / "length-generalization-size.nc").is_file():
        rows.append(("PPL rise vs budget at 4 sizes, T_train 32 and 128 (preset `size`)",
                     "the rise grows with training; shorter contexts fail sooner (its Figs. 2-3)",
                     size_cell(_dataset("length-generalization-size"))))
    if (DATA / "length-generalization-context.nc").is_file():
        rows.append(("PPL rise vs training context (preset `context`)",
                     "shorter training contexts fail sooner; larger models need longer ones (its Fig. 2)",
                     context_cell(_dataset("length-generalization-context"))))
    rows.append(("state passing removes the rise", "yes", removes))
    if (DATA / "length-generalization-interventions.nc").is_file():
        arms = _dataset("length-generalization-interventions")
        other = (_dataset("length-generalization-interventions-no-conv")
                 if (DATA / "length-generalization-interventions-no-conv.nc").is_file() else None)
        where, where_other = _baseline_text(arms, "the quick model with its convolution"), (
            _baseline_text(other, "the quick model without it") if other is not None else "")
        for arm, paper in (("state-passing", "much stabler far PPL (370M–1.3B, its Fig. 5)"),
                           ("tbtt", "close to state passing"),
                           ("fitted-noise", "clear gain at 370M and 780M, not at 1.3B"),
                           ("random-noise", "limited gain at 370M, none at 780M and 1.3B")):
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
    rows += [
        ("state passing improves copying at 3× the training length", "0.27 → 0.47 per character", copying),
        ("fitted noise extends passkey retrieval", "yes (heatmap)", passkey_cell),
        ("bAbI-style accuracy vs length", "a figure", _babi_cell(babi)),
    ]
    if (DATA / "babilong-kinds.nc").is_file():
        rows.append(("bAbI-style kinds vs length (preset `kinds`)", "a figure",
                     _babi_kinds_cell(_dataset("babilong-kinds"))))
    seeds = _seeds(lg["seed"].values)
    mixer = MIXER_NAMES.get(model["mixer"], model["mixer"])
    out = [_prose(f"Preset `{lg.attrs['preset']}`, seeds {seeds}, every seed shown; a tiny {mixer} LM "
                  f"({model['n_layers']} layers, width {model['d_model']}):"), "",
           "| paper B's claim | paper B | dynlab |", "| --- | --- | --- |"]
    out += [f"| {claim} | {paper} | {ours} |" for claim, paper, ours in rows]
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# README.md's prose numbers: paper A's caveats and reproduction, paper B's state statistics,
# and the studies' wall times (each dataset's ``study_wall_time_s``, :mod:`dynlab.runner`)

#: What README says for a dataset written before the runner recorded its wall time.
NO_WALL_TIME = "wall time not recorded"

_NUMBER_WORDS = {0: "zero", 1: "one", 2: "two", 3: "three", 4: "four", 5: "five"}


#: The sweep recipe on fresh seeds, trained after the pre-registered forecast was defined:
#: the fixed-point mechanism and the forecast's score (the last section of docs/results.md).
FRESH_LABEL = "group-tracking-sweep-seeds5-9"
FRESH_HEADING = "Fixed points of the return map, and the pre-registered horizon forecast"
FRESH_COMMAND = "dynlab study group-tracking --models all --preset sweep --seeds 5,6,7,8,9"
FRESH_NOTE = ("the sweep recipe on seeds 5–9, trained once after the forecast `T_prereg` was defined "
              "(docs/error-control.md); ρ⊥, ρ∥ and the fixed points are the `fp_*` variables")


def _r_ci(c: dict, key: str = "r") -> str:
    lo, hi = c[f"{key}_ci"]
    return f"{_paired(c[key])} [{_paired(lo)}, {_paired(hi)}]"


#: The sweep's first seeds (0–4); the fixed points come from their AVX2 re-run (:data:`CROSS_CPU`)
#: when it is committed, else from this dataset when it carries them.
SWEEP_LABEL = "group-tracking-sweep"

#: The run variables the fixed-point section reads from each sweep dataset.
_POOLED_VARS = ("status", "mp", "mp_censored", "horizon", "recovery_rate", "failure_mode_dec", "fp_residual",
                "fp_rho_perp", "fp_rho_par", "fp_drift", "T_cross_fp", "T_cross_par", "T_cross_dec")


def _sweep_sets() -> list[tuple[str, xr.Dataset]]:
    """``[(seeds, dataset)]``: the fresh seeds 5–9, and, when the sweep's seeds 0–4 carry the
    fixed points, those and both pooled (the run variables of :data:`_POOLED_VARS`)."""
    fresh = _dataset(FRESH_LABEL)
    sets = [(_seeds(fresh["seed"].values), fresh)]
    sweep = _dataset(CROSS_CPU[1] if (DATA / f"{CROSS_CPU[1]}.nc").is_file() else SWEEP_LABEL)
    if all(v in sweep for v in _POOLED_VARS) and all(v in fresh for v in _POOLED_VARS):
        pooled = xr.concat([d[list(_POOLED_VARS)] for d in (sweep, fresh)], dim="run", coords="minimal",
                           compat="override", join="outer")
        pooled = pooled.assign_coords(run=np.arange(pooled.sizes["run"]))
        sets = [(_seeds(sweep["seed"].values), sweep), *sets,
                (_seeds(pooled["seed"].values), pooled)]
    return sets


def _found_line(sets: list[tuple[str, xr.Dataset]]) -> str:
    from dynlab.analysis.mechanism import mechanism_correlations

    parts = []
    for seeds, ds in sets:
        m = mechanism_correlations(ds)
        sd = m["state_dependent"]
        parts.append(f"seeds {seeds}: {sd['found']} of {sd['n']} learned state-dependent runs, {m['found']} of "
                     f"{m['n_ok']} learned runs")
    return "; ".join(parts)


def fixed_points_section() -> str:
    """docs/results.md's fixed-point section, from :data:`FRESH_LABEL` (and seeds 0–4, :func:`_sweep_sets`,
    when their dataset carries the fixed points): how many learned runs have fixed points, the mechanism correlations
    (:func:`dynlab.analysis.mechanism.mechanism_correlations`), Corollary 1's predicted crossing
    (:func:`dynlab.analysis.mechanism.corollary1_correlations`) and the pre-registered forecast's score
    (:func:`dynlab.analysis.preregistered.preregistered_scores`, seeds 5–9 only)."""
    from dynlab.analysis.mechanism import corollary1_correlations, mechanism_correlations
    from dynlab.analysis.preregistered import PREREGISTERED_DEFINITION, preregistered_scores

    ds = _dataset(FRESH_LABEL)
    sets = _sweep_sets()
    p = preregistered_scores(ds)
    out = [_prose(f"Preset `{ds.attrs['preset']}` on seeds {_seeds(ds['seed'].values)}, {ds.sizes['run']} runs, "
                  "trained after the forecast below was defined, and the same recipe's seeds 0–4 where their "
                  "dataset carries the fixed points. Fixed points of the return maps (`fp_*`, "
                  f"docs/error-control.md) for every symbolic state and word with residual ≤ 1e-8: "
                  f"{_found_line(sets)}. Across the learned runs, Pearson r and Spearman ρ with 95 % "
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
            out.append(f"| {seeds} | {x} | {y} | {_r_ci(c)} | {_r_ci(c, 'rho')} | {c['n']} |")
        modes_text.append(f"seeds {seeds}: " + "; ".join(
            f"{mode} {v['n']} runs, median ρ⊥ {v['rho_perp']:.3f}, abs(ρ∥ − 1) {v['par_dev']:.3f}"
            for mode, v in m.get("modes", {}).items() if v["n"]))
    out += ["", _prose("By failure mode of `q_dec`: " + "; ".join(modes_text) + ".")]
    c1 = [(seeds, corollary1_correlations(d)) for seeds, d in sets if "T_cross_fp" in d]
    if c1:
        out += ["", _prose("Corollary 1 from the return maps: `T_cross_fp` = t_ref + (τ·M − R∥)/η̄ at t_ref, with "
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
                    out.append(f"| {seeds} | {name}, {rule} | {_r_ci(r)} | {_r_ci(r, 'rho')} | {r['n']} |")
        out += ["", _prose("Runs with a finite `T_cross_fp` (a crossing predicted within the horizon): " + "; ".join(
            f"seeds {seeds}: {c['predicted']} of {c['n_ok']}" for seeds, c in c1) + ".")]
    drop, rep = p["drop"], p["replace"]
    verdict = "at least" if drop["r"] >= FORECAST_GOAL else "short of"
    out += ["", _prose(f"The pre-registered horizon forecast `{PREREGISTERED_DEFINITION}` (docs/error-control.md) "
                       f"gives on seeds {_seeds(ds['seed'].values)} under 'drop' r = {_r_ci(drop)}, ρ = "
                       f"{_r_ci(drop, 'rho')} over {drop['n']} runs ({verdict} {FORECAST_GOAL}); under 'replace' "
                       f"r = {_r_ci(rep)}, ρ = {_r_ci(rep, 'rho')} over {rep['n']} runs.")]
    return "\n".join(out)


def fresh_seeds_section() -> str:
    """README's lines on the fresh seeds 5–9 (the pre-registered forecast's score) and on the
    fixed-point mechanism over every sweep seed that carries it (docs/results.md has the tables)."""
    from dynlab.analysis.mechanism import corollary1_correlations, mechanism_correlations
    from dynlab.analysis.preregistered import PREREGISTERED_DEFINITION, preregistered_scores

    ds = _dataset(FRESH_LABEL)
    p = preregistered_scores(ds)
    seeds, pooled = _sweep_sets()[-1]
    m = mechanism_correlations(pooled)
    drop, rep = p["drop"], p["replace"]
    verdict = "at least" if drop["r"] >= FORECAST_GOAL else "short of"
    perp, mp_r, mp_d = m["recovery_perp"], m["mp_rho_perp_replace"], m["mp_rho_perp_drop"]
    sd = m["state_dependent"]
    text = (f"**Fresh seeds.** `{PREREGISTERED_DEFINITION}`, committed before seeds {_seeds(ds['seed'].values)} "
            f"were trained (docs/error-control.md), gives on them r = {_r_ci(drop)} over {drop['n']} runs under "
            f"'drop' ({verdict} {FORECAST_GOAL}), {_r_ci(rep)} under 'replace'. Seeds {seeds}: {sd['found']} of "
            f"{sd['n']} learned state-dependent runs have fixed points for every state and word; log ρ⊥ there "
            f"predicts the recovery rate along U⊥ (r = {_r_ci(perp)}) and ρ⊥ predicts mp (r = {_r_ci(mp_r)} "
            f"replace, {_r_ci(mp_d)} drop)")
    if "T_cross_fp" in pooled:
        c = corollary1_correlations(pooled)
        text += (f"; Corollary 1's `T_cross_fp`, from the return-map drift, gives r = {_r_ci(c['par_drop'])} "
                 f"against the measured q∥ crossing and {_r_ci(c['mp_drop'])} against mp (drop)")
    return _prose(text + ". Tables: `docs/results.md`.")


def wall_time(ds: xr.Dataset, cpu: bool = True, short: bool = False) -> str:
    """``6.4 min (9 of 9 runs trained, 1 worker, AMD EPYC)`` (seconds under a minute) from
    the dataset's ``study_*`` attributes and (``cpu``) the CPU its ``provenance_json``
    names, or :data:`NO_WALL_TIME` when it has none; ``short``: ``6.4 min (9/9 trained, 1
    worker)``."""
    a = ds.attrs
    if "study_wall_time_s" not in a:
        return NO_WALL_TIME
    runs = len(json.loads(a["specs_json"])) if "specs_json" in a else ds.sizes["run"]
    trained = int(a["study_runs_trained"])
    parts = [f"analyses of {runs} runs, none trained" if a.get("study_invocation") == "analyze"
             else f"{trained}/{runs} trained" if short else f"{trained} of {runs} runs trained"]
    if "study_workers" in a:
        workers = int(a["study_workers"])
        parts.append(f"{workers} worker{'s' if workers != 1 else ''}")
    if cpu and (name := _cpu_of(ds)):
        parts.append(name)
    seconds = float(a["study_wall_time_s"])
    took = f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
    return f"{took} ({', '.join(parts)})"


def _cpu_of(ds: xr.Dataset) -> str:
    """The CPU model that the dataset's provenance names ('' when none)."""
    return str((read_provenance(ds.attrs).get("written_by") or {}).get("cpu_model") or "")


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


def _r(ds: xr.Dataset, variant: str, censoring: str, part: str = "") -> float:
    return float(ds[f"corr_r{part}"].sel(variant=variant, censoring=censoring))


def _and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


def paper_a_reproduction_section() -> str:
    """README's paragraph after the paper-A tables: what the 'replace' r rests on, the
    uncensored r, the literal q, and what the torch-loops run of the same sweep shares with
    the C-loops one (:func:`reproduction_summary`); then both sweeps' wall times."""
    a, b = (_dataset(x) for x in REPRODUCTION[:2])
    default = a.attrs["corr_default_variant"]
    ok, fam = a["status"].values.astype(str) == "ok", a["family"].values.astype(str)
    mp = a["mp"].values.astype(float)
    horizon = max(_first_spec(a)["eval"]["lengths"])
    dep, aff = mp[ok & (fam == "state-dependent")], mp[ok & (fam == "affine")]
    n_drop = int(a["corr_n"].sel(variant=default, censoring="drop"))
    uncensored = (f"among the {n_drop} uncensored runs alone `{default}` still gives "
                  f"r = {_paired(_r(a, default, 'drop'))}")
    if dep.size and aff.size and np.all(dep >= horizon):
        split = (f"**Caveats.** `{default}`'s r = {_paired(_r(a, default, 'replace'))} under 'replace' is mostly "
                 f"the split between the state-dependent cells (all {dep.size} of their learned runs pass every "
                 f"length to {horizon}, so their mp is censored; {int(a['corr_n_both_censored'])} runs have "
                 f"T_cross and mp both censored) and the {aff.size} learned runs of the affine cells (mp "
                 f"{aff.min():.0f}–{aff.max():.0f}, median {np.median(aff):.0f}); {uncensored}.")
    else:
        split = f"**Caveats.** Under 'drop', {uncensored}."
    lit = [(_r(a, "q", c), _r(a, "q", c, "_lo"), _r(a, "q", c, "_hi")) for c in ("replace", "drop")]
    literal = (f"The paper's literal q gives r = {_paired(lit[0][0])} / {_paired(lit[1][0])} (replace / drop)"
               + (", both CIs containing 0: it predicts nothing here." if all(lo <= 0 <= hi for _, lo, hi in lit)
                  else "."))
    rep = reproduction_summary(a, b)
    d = rep["max_learned_diff"]
    learned = ("the same learned count in every cell" if d == 0 else
               f"learned counts within {_NUMBER_WORDS.get(d, d)} run{'s' if d != 1 else ''} per cell")
    held = float(b["corr_heldout_pearson_r"])
    if rep["moved"]:
        arch, group, med_a, med_b = rep["example"]
        moved = (f"the per-seed mp moved only in the cells of {_and(rep['moved_archs'])}, in {rep['moved']} of "
                 f"their {rep['moved_of']} runs learned in both ({arch} on {group}: median {med_a:.0f} → {med_b:.0f})")
    else:
        moved = "every per-seed mp was the same"
    across = (f"**What reproduces across machines:** the same sweep with the torch loops in place of the compiled "
              f"C loops (`DYNLAB_C_KERNELS=0`, rounding-level differences, as between CPU types) gave the same "
              f"status in {rep['same_status']} of {rep['runs']} runs, {learned}, `{default}` r = "
              f"{_paired(_r(b, default, 'replace'))} / {_paired(_r(b, default, 'drop'))} (replace / drop) and "
              f"held-out r = {_paired(held)}; {moved}. Quote the counts, medians and correlations; the per-seed "
              "values are in `docs/results.md`, generated from the committed datasets. All variants, Spearman ρ, "
              "and the nonlinearity ablation are in `docs/results-paper-a.md`.")
    if (DATA / f"{CROSS_CPU[1]}.nc").is_file():
        cpu = reproduction_summary(a, _dataset(CROSS_CPU[1]))
        across += (f" Trained again on an {CROSS_CPU[3]}-only CPU (the committed sweep: {CROSS_CPU[2]}), the "
                   f"same status in {cpu['same_status']} of {cpu['runs']} runs, "
                   + ("every per-seed mp of the runs learned on both the same" if not cpu["moved"] else
                      f"per-seed mp moved in {cpu['moved']} of {cpu['moved_of']} runs learned on both")
                   + " (`docs/results.md`).")
    wall = (f"Wall times, from each dataset's `study_wall_time_s`: the C-loops sweep: {wall_time(a)}; "
            f"the torch-loops sweep: {wall_time(b)}.")
    return _prose(f"{split} {literal} {across} {wall}")


#: The paper-B datasets whose wall times README gives (labels in :data:`DATASETS`).
PAPER_B_WALL_TIMES = ("length-generalization", "length-generalization-no-conv", "length-generalization-budget",
                      "length-generalization-context", "length-generalization-interventions",
                      "length-generalization-interventions-no-conv", "copying", "passkey", "babilong",
                      "babilong-kinds")


def state_std_growth(ds: xr.Dataset, intervention: str) -> np.ndarray:
    """Per run of ``intervention``: the state std (mean over layers and heads) at the end
    of the evaluation length divided by that at the training length."""
    t0, t1 = int(ds["train_length"].max()), int(ds["eval_length"].max())
    std = ds["state_std"].mean(["layer", "head"])
    ratio = std.sel(t=t1) / std.sel(t=t0)
    return ratio.values[ds["intervention"].values.astype(str) == intervention].astype(float)


def paper_b_notes_section() -> str:
    """README's numbers after the paper-B verdicts: the state-std growth of the zero-state
    baseline and of state passing, and every paper-B study's wall time."""
    lg = _dataset("length-generalization")
    t0, t1 = int(lg["train_length"].max()), int(lg["eval_length"].max())
    zero, sp = state_std_growth(lg, "zero"), state_std_growth(lg, "state-passing")
    within = 100 * np.max(np.abs(sp - 1))
    state = (f"From t = {t0} to {t1} the zero-state baseline's state std (`state_std`, mean over layers and heads) "
             f"still grows {zero.min():.1f}–{zero.max():.1f}× ({zero.size} seeds); state passing keeps it within "
             f"{within:.0f} % ({sp.min():.2f}–{sp.max():.2f}×).")
    timed = [(label, _dataset(label)) for label in PAPER_B_WALL_TIMES if (DATA / f"{label}.nc").is_file()]
    cpus = {_cpu_of(ds) for _, ds in timed if "study_wall_time_s" in ds.attrs}
    one_cpu = len(cpus) == 1 and "" not in cpus
    walls = "; ".join(f"{label} {wall_time(ds, cpu=not one_cpu, short=True)}" for label, ds in timed)
    where = f", all on an {cpus.pop()}" if one_cpu else ""
    learn = learnability_text()
    return _prose(f"{state}{' ' + learn if learn else ''} Wall times, from each dataset's `study_wall_time_s`"
                  f"{where}: {walls}.")


#: The task presets' learnability on seeds never used to choose their rules: (what, dataset label).
LEARNABILITY = (("copying", "copying-seeds20-24"), ("passkey", "passkey-learnability"),
                ("babilong", "babilong-learnability"), ("babilong `kinds`", "babilong-kinds-learnability"))


def learnability_text() -> str:
    """README's sentence on how many models each task preset's own rules train to its
    learned threshold (in-range test accuracy ≥ ``learned_at``) on seeds that played no part
    in choosing those rules, with each seed's in-range accuracy and, where a preset draws a
    fresh model after a failure, how many it drew."""
    parts, seeds, at = [], set(), set()
    for what, label in LEARNABILITY:
        if not (DATA / f"{label}.nc").is_file():
            continue
        ds = _dataset(label)
        learned, trained = _learned(ds)
        base = ds["phase"].values.astype(str) == "base"
        seeds |= {int(x) for x in ds["seed"].values[base]}
        at.add(float(ds.attrs["learned_at"]))
        acc = ds["in_range_accuracy"].values[base].astype(float)
        detail = f"in range {acc.min():.2f}–{acc.max():.2f}"
        if _first_spec(ds)["train"].get("attempts", 1) > 1 and "train_attempts" in ds:
            detail += "; models drawn " + ", ".join(str(int(x)) for x in ds["train_attempts"].values[base])
        parts.append(f"{what} {learned} of {trained} ({detail})")
    if not parts:
        return ""
    return (f"Learned (in-range test accuracy ≥ {'/'.join(f'{x:g}' for x in sorted(at))}) on seeds "
            f"{_seeds(sorted(seeds))}, never used to choose the task presets' rules: "
            + "; ".join(parts) + ".")


#: README.md's generated sections, by marker name.
README_SECTIONS = {"paper-a": paper_a_section, "paper-b": paper_b_section}
README_SECTIONS["paper-a-reproduction"] = paper_a_reproduction_section
README_SECTIONS["paper-b-notes"] = paper_b_notes_section
README_SECTIONS["paper-a-fresh"] = fresh_seeds_section


def _markers(name: str) -> tuple[str, str]:
    return f"<!-- results:{name} -->", f"<!-- /results:{name} -->"


def _section_pattern(name: str) -> re.Pattern:
    start, end = _markers(name)
    return re.compile(re.escape(start) + r"\n(.*?)\n" + re.escape(end), re.S)


def readme(text: str) -> str:
    """``text`` (README.md) with every section of :data:`README_SECTIONS` rewritten from the
    datasets; a section whose markers are missing or repeated is an error."""
    for name, make in README_SECTIONS.items():
        pattern = _section_pattern(name)
        if len(pattern.findall(text)) != 1:
            raise ValueError(f"README.md needs exactly one {_markers(name)[0]} … {_markers(name)[1]} section")
        start, end = _markers(name)
        body = make()
        text = pattern.sub(lambda m: f"{start}\n{body}\n{end}", text)
    return text


def stale_sections(text: str) -> list[str]:
    """Names of the README sections whose text differs from what the datasets give."""
    fresh = readme(text)
    return [n for n in README_SECTIONS if _section_pattern(n).search(text).group(1)
            != _section_pattern(n).search(fresh).group(1)]


def slim(study_dataset: Path, label: str) -> Path:
    """Copy the variables the tables read (run record, mp, correlations, the crossing times
    and forecasts they correlate, to recompute them, and the per-state fixed-point summaries
    with the recovery rates and failure modes) of a group-tracking
    ``dataset.nc`` to ``DATA/<label>.nc`` (a whole sweep dataset holds every curve of every run)."""
    from dynlab.analysis.correlation import CROSSING_VARIANTS, FORECAST_VARIANTS
    from dynlab.results.schema import write_dataset

    ds = open_dataset(study_dataset)
    if ds.attrs.get("study") == "length-generalization":
        return write_dataset(_slim_lm(ds), DATA / f"{label}.nc")
    crossings = {var for var, _ in (*CROSSING_VARIANTS.values(), *FORECAST_VARIANTS.values())}
    fixed_points = ("fp_residual", "fp_count", "fp_dim", "fp_rho_perp", "fp_rho_par", "fp_stable", "recovery_rate",
                    "failure_mode_dec", "fp_drift", "T_cross_fp")  # the fixed-point section's variables, where the study has them
    keep = [v for v in ds.data_vars
            if v in ("mp", "mp_censored", "status", "horizon") or v in crossings or v.startswith("corr_")
            or v in fixed_points]
    return write_dataset(ds[keep], DATA / f"{label}.nc")


def _slim_lm(ds: xr.Dataset) -> xr.Dataset:
    """A length-generalization dataset without its per-position curves (PPL(t), EffRem, state
    statistics): the run record, the PPL ranges and ratios, the verdicts, and ``ppl_binned``
    at its bin ends only (``t`` is then the bin ends)."""
    drop = [v for v in ds.data_vars if v == "ppl" or v.startswith(("state_", "effrem"))]
    ds = ds.drop_vars(drop)
    ends = ds["t"].values[np.isfinite(ds["ppl_binned"].values).reshape(-1, ds.sizes["t"]).any(axis=0)]
    return ds.sel(t=ends)


def main(argv: list[str]) -> int:
    if argv[:1] == ["--slim"]:  # --slim STUDY_FOLDER_OR_NC LABEL
        print(f"wrote {slim(Path(argv[1]), argv[2])}")
        return 0
    text, current = document(), README.read_text(encoding="utf-8")
    if "--check" in argv:
        same = OUT.is_file() and OUT.read_text() == text
        stale = stale_sections(current)
        print("docs/results.md is up to date" if same else "docs/results.md is stale: run python benchmarks/make_results.py")
        print(f"README.md sections stale: {', '.join(stale)}" if stale else "README.md's tables are up to date")
        return 0 if same and not stale else 1
    OUT.write_text(text)
    README.write_text(readme(current), encoding="utf-8")
    print(f"wrote {OUT} and the tables of {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
