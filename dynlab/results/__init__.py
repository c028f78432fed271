"""Dataset schema and the run store.

The names below are imported on first use, so that a torch-free module of this package
(:mod:`~dynlab.results.provenance`, :mod:`~dynlab.results.vocabulary`) loads without the
run store (which needs torch).
"""

from __future__ import annotations

from dynlab._lazy import lazy_exports

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


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
