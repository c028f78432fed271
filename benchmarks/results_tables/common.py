"""What every section of the results reads and how it writes numbers: the dataset folder,
a dataset's first run spec, seed lists, signs and minus signs, correlation intervals, README's
wrapped prose, and a study's wall time from its dataset's ``study_*`` attributes."""

from __future__ import annotations

import json
import textwrap
from pathlib import Path

import xarray as xr

from dynlab.results.provenance import read_provenance
from dynlab.results.schema import open_dataset

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "results" / "datasets"


def prose(text: str) -> str:
    """A sentence of README prose, wrapped at 90 columns as the hand-written text is."""
    return textwrap.fill(text, width=90, break_long_words=False, break_on_hyphens=False)


def dataset(label: str) -> xr.Dataset:
    return open_dataset(DATA / f"{label}.nc")


def first_spec(ds: xr.Dataset) -> dict:
    """The fields of the dataset's first run spec."""
    return json.loads(ds.attrs["specs_json"])[0]["fields"]


def seed_range(values) -> str:
    """``0–4`` for consecutive seeds, else ``0, 2, 5``."""
    s = sorted({int(v) for v in values})
    return f"{s[0]}–{s[-1]}" if len(s) > 1 and s == list(range(s[0], s[-1] + 1)) else ", ".join(map(str, s))


def minus(x: float, digits: int = 2, sign: bool = False) -> str:
    """``x`` with a typographic minus (and ``+`` when ``sign``)."""
    text = f"{x:+.{digits}f}" if sign else f"{x:.{digits}f}"
    return text.replace("-", "−")


def paired(x: float, digits: int = 2) -> str:
    """``+0.99`` / ``-0.07`` (the correlation tables' format)."""
    return f"{x:+.{digits}f}"


def r_ci(c: dict, key: str = "r") -> str:
    lo, hi = c[f"{key}_ci"]
    return f"{paired(c[key])} [{paired(lo)}, {paired(hi)}]"



def join_and(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " and " + names[-1]


#: What README says for a dataset written before the runner recorded its wall time.
NO_WALL_TIME = "wall time not recorded"


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
    if cpu and (name := cpu_of(ds)):
        parts.append(name)
    seconds = float(a["study_wall_time_s"])
    took = f"{seconds:.0f} s" if seconds < 60 else f"{seconds / 60:.1f} min"
    return f"{took} ({', '.join(parts)})"


def cpu_of(ds: xr.Dataset) -> str:
    """The CPU model that the dataset's provenance names ('' when none)."""
    return str((read_provenance(ds.attrs).get("written_by") or {}).get("cpu_model") or "")

