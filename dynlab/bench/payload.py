"""The benchmark's JSON: :func:`bench_train <dynlab.bench.bench_train>` results as one file
holds them (:func:`train_payload`), written atomically as strict JSON with the machine it
ran on (:func:`write_json`, :func:`write_bench_json`, :func:`strict_json`)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from dynlab.outputs import check_json_path

__all__ = ["strict_json", "train_payload", "write_bench_json", "write_json"]


def train_payload(results: list[dict[str, Any]]) -> dict[str, Any]:
    """:func:`~dynlab.bench.bench_train` results as one benchmark file holds them: ``{"results": [...]}``
    plus the first setting's summary at the top level, and this machine under ``machine``
    (:func:`dynlab.results.provenance.machine_record`).  ``dynlab bench train`` prints it with
    :func:`dynlab.report.bench_markdown` (the tables ``dynlab report FILE.json`` prints)."""
    from dynlab.results.provenance import machine_record

    payload: dict[str, Any] = {"machine": machine_record(), "results": results}
    if results:
        payload["speedup_vs_baseline"] = results[0]["speedup_vs_baseline"]
        payload["fraction_of_floor"] = results[0]["fraction_of_floor"]
    return payload


def write_json(results: list[dict[str, Any]], path: str | Path) -> Path:
    """Write :func:`~dynlab.bench.bench_train` results (:func:`train_payload`) with :func:`write_bench_json`."""
    return write_bench_json(train_payload(results), path)


def write_bench_json(payload: dict[str, Any], path: str | Path) -> Path:
    """Write one benchmark's results to ``path`` atomically as strict JSON
    (:func:`strict_json`), with the machine it ran on under ``machine``
    (:func:`dynlab.results.provenance.machine_record`: CPU model, cores, torch version,
    date).  Every benchmark JSON file dynlab and ``benchmarks/`` write goes through here;
    a path :func:`~dynlab.outputs.check_json_path` refuses is refused."""
    from dynlab.results.files import write_text_atomic
    from dynlab.results.provenance import machine_record

    path = check_json_path(path)
    data = {"machine": machine_record(), **payload}
    return write_text_atomic(path, json.dumps(strict_json(data), indent=1, allow_nan=False) + "\n")


def strict_json(obj: Any) -> Any:
    """A copy of ``obj`` with every non-finite float (NaN, ±inf) replaced by None (JSON ``null``)."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: strict_json(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [strict_json(v) for v in obj]
    return obj
