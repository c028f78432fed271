"""Recurrent cells, the tracker stack, the registry and the family probe.

The public names below are imported on first use (as in :mod:`dynlab`), so that one
module (the cells, the tracker) loads without the others.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynlab._lazy import lazy_exports

if TYPE_CHECKING:  # what _EXPORTS names, for type checkers and benchmarks/import_graph.py
    from dynlab.tracking.models.cell_base import Cell
    from dynlab.tracking.models.nonlinearity import NONLINEARITIES
    from dynlab.tracking.models.probe import measure_family, probe_jacobian_variation
    from dynlab.tracking.models.registry import BUILTIN_ARCHS, available_cells, get_cell, register_cell
    from dynlab.tracking.models.tracker import Tracker, TrackerOutput

#: Public name -> the module that defines it, imported when the name is first read.
_EXPORTS = {
    "BUILTIN_ARCHS": "dynlab.tracking.models.registry",
    "Cell": "dynlab.tracking.models.cell_base",
    "NONLINEARITIES": "dynlab.tracking.models.nonlinearity",
    "Tracker": "dynlab.tracking.models.tracker",
    "TrackerOutput": "dynlab.tracking.models.tracker",
    "available_cells": "dynlab.tracking.models.registry",
    "get_cell": "dynlab.tracking.models.registry",
    "measure_family": "dynlab.tracking.models.probe",
    "probe_jacobian_variation": "dynlab.tracking.models.probe",
    "register_cell": "dynlab.tracking.models.registry",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
