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

The sections themselves are made in the ``results_tables`` package beside this script (one
module per section, :mod:`results_tables`); this script says which datasets docs/results.md
shows in what order and which README sections there are, and writes or checks them.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

from dynlab.results.schema import open_dataset
from dynlab.report import report, reproduction_tables

from results_tables.common import DATA, ROOT
from results_tables.fixed_points import (FRESH_COMMAND, FRESH_HEADING, FRESH_LABEL, FRESH_NOTE, fixed_points_section,
                                         fresh_seeds_section)
from results_tables.lm_interventions import INTERVENTION_LABELS, tbtt_coverage_text
from results_tables.paper_a import paper_a_section
from results_tables.paper_b import paper_b_notes_section, paper_b_section
from results_tables.paper_b_verdicts import ANNEALED, paper_b_verdicts_section
from results_tables.lm_ppl import annealed_section
from results_tables.reproduction import CROSS_CPU, CROSS_CPU_NOTE, REPRODUCTION, REPRODUCTION_NOTE, \
    paper_a_reproduction_section
from results_tables.slim import slim

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
     "dynlab study length-generalization --seeds 0,1,2 --interventions zero,state-passing --config "
     "benchmarks/configs/no-conv.toml",
     "the mixers of dynlab before the convolution (conv_kernel = 0): the comparison that isolates it"),
    ("length-generalization-budget", "PPL rise against the training budget (preset budget)",
     "dynlab study length-generalization --preset budget --executor dask --workers 2",
     "one model per seed trained to 32× its Chinchilla budget (20 tokens per parameter, every parameter counted), "
     "evaluated at 16× T_train from checkpoints inside the run; far/in > 1 means PPL rises beyond T_train"),
    ("length-generalization-size", "PPL rise against budget, model size and context (preset size)",
     "dynlab study length-generalization --preset size --executor dask --workers 2",
     "4 widths (2,670-60,784 block parameters) x T_train 32 and 128 x seeds 0-2, each trained as one stack of its "
     "3 seeds to 32x its Chinchilla budget with checkpoints inside the run, and trained alone to 1x and 4x; "
     "far_over_in divides the far PPL by the mean PPL over (T_train/2, T_train], one reference for every T_train; "
     "every stack trained with the stack's CPU Mamba-2 scan (kernels.ssd.grouped)"),
    ("length-generalization-size-annealed", "The size map's rises on annealed runs (preset size-annealed)",
     "dynlab study length-generalization --preset size-annealed --executor dask --workers 2",
     "each width, T_train and budget where most seeds of the size map rose at an in-run checkpoint and the size "
     "preset trains no annealed run, trained alone to that budget (its learning-rate schedule ends there) on the same "
     "seeds 0-2, the size recipe unchanged; then every run trained alone (these and the size preset's own) beside the "
     "in-run checkpoint at its budget"),
    ("length-generalization-state", "Where small LMs learn to forget (preset state, pre-registered)",
     "dynlab study length-generalization --preset state --seeds 0,1,2 --executor dask --workers 2",
     "Mamba-2 at width 32 with the recurrent state 1,024 to 65,536 entries (d_state 8-512) x T_train 16-512 x "
     "seeds 0-2, every run on the same 8.4M tokens, evaluated at 16x its T_train; read by the rule and verdicts "
     "fixed in docs/preregistration-forget-threshold.md before these seeds ran"),
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
     "dynlab study length-generalization --preset interventions --seeds 0,1,2,3,4 --config "
     "benchmarks/configs/no-conv.toml",
     "the protocol of the interventions preset from the quick model without its short convolution"),
    ("copying", "Copying", "dynlab study copying",
     "per-character accuracy; trained on 1–16 letters, so 48 is 3× the longest training string"),
    ("copying-state128", "Copying with a 4× larger state (capacity check)",
     "dynlab study copying --config benchmarks/configs/state128.toml",
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


#: The heading of docs/results.md's table of paper B's claims with all their numbers (README
#: gives one verdict per claim).
PAPER_B_DETAIL = "Paper B's claims in detail"


def document() -> str:
    parts = [HEADER]
    for label, heading, command, note in DATASETS:
        path = DATA / f"{label}.nc"
        if not path.is_file():
            continue
        if label == "length-generalization":
            parts.append(f"## {PAPER_B_DETAIL}\n\n{paper_b_section()}\n")
        if label in INTERVENTION_LABELS:
            note += tbtt_coverage_text(open_dataset(path))
        size = DATA / "length-generalization-size.nc"
        table = (annealed_section(open_dataset(size), open_dataset(path)) if label == ANNEALED and size.is_file()
                 else report(path))  # the annealed runs beside the size map's checkpoints, each run once
        parts.append(f"## {heading}\n\n`{command}` — {note}.\n\n{table}")
        for pair, what, note in ((REPRODUCTION, "C loops against torch loops", REPRODUCTION_NOTE),
                                 (CROSS_CPU, "two CPU types", CROSS_CPU_NOTE)):
            if label == pair[0] and (DATA / f"{pair[1]}.nc").is_file():
                a, b = (open_dataset(DATA / f"{x}.nc") for x in pair[:2])
                parts.append(f"### What reproduces: {what}\n\n{note}\n\n{reproduction_tables(a, b, *pair[2:])}")
    if (DATA / f"{FRESH_LABEL}.nc").is_file():
        parts.append(f"## {FRESH_HEADING}\n\n`{FRESH_COMMAND}` — {FRESH_NOTE}.\n\n{fixed_points_section()}\n")
    return "\n".join(parts)



#: README.md's generated sections, by marker name.
README_SECTIONS = {"paper-a": paper_a_section, "paper-b": paper_b_verdicts_section,
                   "paper-a-reproduction": paper_a_reproduction_section, "paper-b-notes": paper_b_notes_section,
                   "paper-a-fresh": fresh_seeds_section}


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
