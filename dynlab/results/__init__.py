"""Dataset schema and the run store.

The names below are imported on first use, so that a torch-free module of this package
(:mod:`~dynlab.results.provenance`, :mod:`~dynlab.results.vocabulary`) loads without the
run store (which needs torch).
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "RunStore": "dynlab.results.store",
    "VARIABLES": "dynlab.results.schema",
    "annotate": "dynlab.results.schema",
    "open_dataset": "dynlab.results.schema",
    "provenance_attrs": "dynlab.results.schema",
    "write_dataset": "dynlab.results.schema",
    "attrs_of": "dynlab.results.vocabulary",
    "curves": "dynlab.results.positions",
    "var": "dynlab.results.vocabulary",
}

__all__ = ["RunStore", "VARIABLES", "annotate", "open_dataset", "provenance_attrs", "write_dataset", "attrs_of", "var", "curves"]


def __getattr__(name: str) -> Any:
    if name in _EXPORTS:
        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dynlab.results' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
