"""Number formats and the lines every study report opens with: the machine a dataset's runs ran on, the runs' statuses."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.results.provenance import read_provenance

__all__ = ["fmt_number", "fmt_p", "machine_line", "spread_text", "status_line"]


def fmt_number(x: float, digits: int = 2) -> str:
    """``x`` with ``digits`` decimals; "—" for None or a number that is not finite."""
    return "—" if x is None or not np.isfinite(x) else f"{x:.{digits}f}"


def fmt_p(p: float, digits: int = 3) -> str:
    """A p-value for a table: ``digits`` decimals, ``< 0.001`` (for 3 digits) below the
    smallest one they show, never ``0.000``; "—" when not finite."""
    if p is None or not np.isfinite(p):
        return "—"
    floor = 10.0 ** -digits
    return f"< {floor:.{digits}f}" if p < floor else f"{p:.{digits}f}"


def spread_text(values: np.ndarray, digits: int = 2) -> str:
    """``mean (min–max)`` over seeds, or the one value."""
    v = np.asarray(values, dtype=float)
    v = v[np.isfinite(v)]
    if v.size == 0:
        return "—"
    if v.size == 1:
        return fmt_number(v[0], digits)
    return f"{fmt_number(v.mean(), digits)} ({fmt_number(v.min(), digits)}–{fmt_number(v.max(), digits)})"


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
    if a.get("tokenizer") and a.get("tokenizer") != "byte":
        parts.append(f"tokens of {a['tokenizer']}")
    return "; ".join(parts)


def status_line(ds: xr.Dataset) -> str:
    base = ds.isel(run=np.flatnonzero(ds["phase"].values.astype(str) == "base"))
    lines = []
    for arch in dict.fromkeys(base["arch"].values.astype(str)):
        rows = base.isel(run=np.flatnonzero(base["arch"].values.astype(str) == arch))
        st = rows["status"].values.astype(str)
        drawn = rows["train_attempts"].values if "train_attempts" in rows else np.full(rows.sizes["run"], np.nan)
        scores = ", ".join(f"seed {int(s)}: {fmt_number(float(a))}" + (f" ({int(n)} models drawn)" if n > 1 else "")
                           for s, a, n in zip(rows["seed"].values, rows["in_range_accuracy"].values, drawn))
        at = ds.attrs.get("learned_at")
        rule = f"; learned at ≥ {float(at):g}" if at is not None and np.isfinite(float(at)) else ""
        lines.append(f"- `{arch}`: {int((st == 'ok').sum())} of {len(st)} trained models learned "
                     f"(in-range accuracy {scores}{rule})")
    return "\n".join(lines)
