"""docs/results.md's table of paper B's claims with all their numbers (README gives one verdict
per claim: :mod:`results_tables.paper_b_verdicts`) and README's notes after its table: the
state-std growth and every paper-B study's wall time."""

from __future__ import annotations

import numpy as np
import xarray as xr

from results_tables.common import DATA, cpu_of, dataset, first_spec, prose, seed_range, wall_time
from results_tables.lm_interventions import intervention_rows
from results_tables.lm_ppl import budget_cell, context_cell, ratio_stats, size_cell
from dynlab.lm.report.tables import RISE
from results_tables.tasks import babi_cell, babi_kinds_cell, copying_cell, learnability_text, passkey_cell

#: How README names the LM mixers.
MIXER_NAMES = {"mamba2": "Mamba-2", "mamba1": "Mamba-1", "gla": "GLA"}


def _rise_rows(lg: xr.Dataset, lg0: xr.Dataset) -> list[tuple[str, str, str]]:
    """README's rows on the PPL rise from the zero state: its far/in ratio, then against the
    training budget, the model size and the training context (the presets committed)."""
    zero, zero0 = ratio_stats(lg, "zero"), ratio_stats(lg0, "zero")
    rise = (f"far/in PPL ratio {zero[0]} (a rise, > {RISE}, in {zero[1]} seeds); with `conv_kernel = 0`, "
            f"{zero0[0]} ({zero0[1]})")
    rows = [("PPL rises beyond the training length from the zero state", "yes (370M–1.3B checkpoints)", rise)]
    if (DATA / "length-generalization-budget.nc").is_file() and not (DATA / "length-generalization-size.nc").is_file():
        rows.append(("PPL rise vs training budget (preset `budget`)",  # the size map holds its model (width 16)
                     "rises from about 7.5× the Chinchilla budget, growing with training (Mamba-2 85M, T = 1024; "
                     "its Fig. 3)", budget_cell(dataset("length-generalization-budget"))))
    if (DATA / "length-generalization-size.nc").is_file():
        rows.append(("PPL rise vs budget at 4 sizes, T_train 32 and 128 (preset `size`)",
                     "the rise grows with training; shorter contexts fail sooner (its Figs. 2-3)",
                     size_cell(dataset("length-generalization-size"))))
    if (DATA / "length-generalization-context.nc").is_file():
        rows.append(("PPL rise vs training context (preset `context`)",
                     "shorter training contexts fail sooner; larger models need longer ones (its Fig. 2)",
                     context_cell(dataset("length-generalization-context"))))
    return rows


def paper_b_section() -> str:
    """docs/results.md's paper-B table: each claim, paper B's answer, and all of dynlab's numbers."""
    lg, lg0 = dataset("length-generalization"), dataset("length-generalization-no-conv")
    passkey, babi = dataset("passkey"), dataset("babilong")
    copying = copying_cell()
    model = first_spec(lg)["model"]
    sp, sp0, tbtt = ratio_stats(lg, "state-passing"), ratio_stats(lg0, "state-passing"), ratio_stats(lg, "tbtt")
    removes = f"trained with it: ratio {sp[0]} ({sp0[0]} without the convolution); TBTT {tbtt[0]}"
    rows = _rise_rows(lg, lg0)
    rows.append(("state passing removes the rise", "yes", removes))
    if (DATA / "length-generalization-interventions.nc").is_file():
        other = (dataset("length-generalization-interventions-no-conv")
                 if (DATA / "length-generalization-interventions-no-conv.nc").is_file() else None)
        rows += intervention_rows(dataset("length-generalization-interventions"), other)
    rows += [
        ("state passing improves copying at 3× the training length", "0.27 → 0.47 per character", copying),
        ("fitted noise extends passkey retrieval", "yes (heatmap)", passkey_cell(passkey)),
        ("bAbI-style accuracy vs length", "a figure", babi_cell(babi)),
    ]
    if (DATA / "babilong-kinds.nc").is_file():
        rows.append(("bAbI-style kinds vs length (preset `kinds`)", "a figure",
                     babi_kinds_cell(dataset("babilong-kinds"))))
    seeds = seed_range(lg["seed"].values)
    mixer = MIXER_NAMES.get(model["mixer"], model["mixer"])
    out = [prose(f"Preset `{lg.attrs['preset']}`, seeds {seeds}, every seed shown; a tiny {mixer} LM "
                 f"({model['n_layers']} layers, width {model['d_model']}):"), "",
           "| paper B's claim | paper B | dynlab |", "| --- | --- | --- |"]
    out += [f"| {claim} | {paper} | {ours} |" for claim, paper, ours in rows]
    return "\n".join(out)

#: The paper-B datasets whose wall times README gives (labels in make_results.py's ``DATASETS``).
PAPER_B_WALL_TIMES = ("length-generalization", "length-generalization-no-conv", "length-generalization-budget",
                      "length-generalization-context", "length-generalization-interventions",
                      "length-generalization-interventions-no-conv", "copying", "passkey", "babilong",
                      "babilong-kinds")


def state_std_growth(ds: xr.Dataset, intervention: str) -> np.ndarray:
    """Per run of ``intervention``: the state std (mean over layers and heads) at the end
    of the evaluation length divided by that at the training length."""
    t0, t1 = int(ds["train_length"].max()), int(ds["eval_length"].max())
    std = ds["state_std"].mean(["layer", "head"])
    ratio = std.sel(t_state=t1) / std.sel(t_state=t0)
    return ratio.values[ds["intervention"].values.astype(str) == intervention].astype(float)


def paper_b_notes_section() -> str:
    """README's numbers after the paper-B verdicts: the state-std growth of the zero-state
    baseline and of state passing, and every paper-B study's wall time."""
    lg = dataset("length-generalization")
    t0, t1 = int(lg["train_length"].max()), int(lg["eval_length"].max())
    zero, sp = state_std_growth(lg, "zero"), state_std_growth(lg, "state-passing")
    within = 100 * np.max(np.abs(sp - 1))
    state = (f"From t = {t0} to {t1} the zero-state baseline's state std (`state_std`, mean over layers and heads) "
             f"still grows {zero.min():.1f}–{zero.max():.1f}× ({zero.size} seeds); state passing keeps it within "
             f"{within:.0f} % ({sp.min():.2f}–{sp.max():.2f}×).")
    timed = [(label, dataset(label)) for label in PAPER_B_WALL_TIMES if (DATA / f"{label}.nc").is_file()]
    cpus = {cpu_of(ds) for _, ds in timed if "study_wall_time_s" in ds.attrs}
    one_cpu = len(cpus) == 1 and "" not in cpus
    walls = "; ".join(f"{label} {wall_time(ds, cpu=not one_cpu, short=True)}" for label, ds in timed)
    where = f", all on an {cpus.pop()}" if one_cpu else ""
    learn = learnability_text()
    return prose(f"{state}{' ' + learn if learn else ''} Wall times, from each dataset's `study_wall_time_s`"
                  f"{where}: {walls}.")
