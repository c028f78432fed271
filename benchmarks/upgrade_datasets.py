"""Bring the committed datasets in benchmarks/results/datasets/ to the current dataset schema,
without retraining: the vocabulary's long names and units (``annotate``), the ``Conventions``
attribute, and for paper B's language-model datasets each curve on its own positions
(:func:`dynlab.results.layout.split_positions`, which ``open_dataset`` also applies when it
reads an old file).  Values are not changed; each file records
what was done in its CF ``history`` attribute.  Run from the repository root:
``python benchmarks/upgrade_datasets.py`` (``--check``: exit 1 when a file is not up to date).

Training-loss curves cannot be added this way: the runs behind these files did not store
them.  A dataset gains them when its study is run again.  Where a file has them, its
``converged`` flags are recomputed from ``train_loss_curve`` by the current rule
(:func:`dynlab.results.assemble.converged_flags`, the rule in the variable's ``rule``
attribute), which its ``history`` then says.
"""

from __future__ import annotations

import sys
from pathlib import Path

import xarray as xr

from dynlab.results.assemble import converged_flags
from dynlab.results.files import NETCDF_ENGINE
from dynlab.results.layout import split_positions
from dynlab.results.schema import CONVENTIONS, annotate, write_dataset
from dynlab.results.vocabulary import attrs_of, check_dataset
from dynlab.training import CONVERGED_RULE

DATA = Path(__file__).resolve().parent / "results" / "datasets"
NOTE = "upgraded to the current schema by benchmarks/upgrade_datasets.py (values unchanged)"
FLAGS_NOTE = "converged recomputed from train_loss_curve by the current rule (benchmarks/upgrade_datasets.py)"


def _flags_stale(ds) -> bool:
    """Whether ``ds`` holds ``converged`` flags of another rule than the current one."""
    if "converged" not in ds or "train_loss_curve" not in ds:
        return False
    return (ds["converged"].attrs.get("rule") != CONVERGED_RULE
            or not (ds["converged"].values.astype(bool) == converged_flags(ds)).all())


def upgraded(ds):
    """``ds`` in the current schema (a new object; ``ds`` is not changed)."""
    out = annotate(split_positions(ds.copy()))
    notes = [NOTE]
    if _flags_stale(out):
        out["converged"] = (out["converged"].dims, converged_flags(out), attrs_of("converged", rule=CONVERGED_RULE))
        notes.append(FLAGS_NOTE)
    for note in notes:
        if note not in out.attrs.get("history", ""):
            out.attrs["history"] = "; ".join(h for h in (out.attrs.get("history", ""), note) if h)
    out.attrs["Conventions"] = CONVENTIONS
    return out


def stale(ds) -> list[str]:
    """Why ``ds`` is not in the current schema (empty when it is)."""
    why = check_dataset(ds)
    if ds.attrs.get("Conventions") != CONVENTIONS:
        why.append(f"Conventions {ds.attrs.get('Conventions')!r}, want {CONVENTIONS!r}")
    if split_positions(ds) is not ds:
        why.append("LM curves share one padded t axis")
    if _flags_stale(ds):
        why.append("converged flags of another rule than dynlab.training.CONVERGED_RULE")
    return why


def main(argv: list[str]) -> int:
    bad = 0
    for path in sorted(DATA.glob("*.nc")):
        with xr.open_dataset(path, engine=NETCDF_ENGINE) as f:  # as written (open_dataset reads the current layout)
            ds = f.load()
        why = stale(ds)
        if "--check" in argv:
            if why:
                bad += 1
                print(f"{path.name}: {why[0]}" + (f" (+{len(why) - 1} more)" if len(why) > 1 else ""))
            continue
        if why:
            write_dataset(upgraded(ds), path)
            print(f"upgraded {path.name}")
    if "--check" in argv:
        print("every dataset is up to date" if not bad else f"{bad} datasets are not: run python benchmarks/upgrade_datasets.py")
    return 1 if bad else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
