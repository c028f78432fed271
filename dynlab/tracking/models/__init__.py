"""Recurrent cells, the tracker stack, the registry and the family probe."""

from dynlab.tracking.models.cell_base import Cell
from dynlab.tracking.models.nonlinearity import NONLINEARITIES
from dynlab.tracking.models.probe import measure_family, probe_jacobian_variation
from dynlab.tracking.models.registry import BUILTIN_ARCHS, available_cells, get_cell, register_cell
from dynlab.tracking.models.tracker import Tracker, TrackerOutput

__all__ = [
    "BUILTIN_ARCHS",
    "Cell",
    "NONLINEARITIES",
    "Tracker",
    "TrackerOutput",
    "available_cells",
    "get_cell",
    "measure_family",
    "probe_jacobian_variation",
    "register_cell",
]
