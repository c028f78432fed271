"""Error-control analysis: pure functions from hidden states (or protocol models) to xarray.

Shared by both papers, this package imports neither (``dynlab.tracking``, ``dynlab.lm``):
paper A's per-run tracker analysis, which runs the trackers, is :mod:`dynlab.tracking.analysis`,
its fixed-point analysis per symbolic state (on the finder here) :mod:`dynlab.tracking.analysis.fixed_points`.

The public names below are imported on first use (as in :mod:`dynlab`): a module such as
``geometry`` loads without the others (``correlation`` imports scipy.stats).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynlab._lazy import lazy_exports

if TYPE_CHECKING:  # what _EXPORTS names, for type checkers and benchmarks/import_graph.py
    from dynlab.analysis.centroids import class_centroids
    from dynlab.analysis.correlation import CorrelationResult, tcross_mp_correlation
    from dynlab.analysis.fixed_points.finder import FixedPoints, find_fixed_points
    from dynlab.analysis.geometry import crossing_time, geometry_over_time, readout_tau, symbolic_basis
    from dynlab.analysis.jacobian import (
        analysis_copy, lyapunov_exponents, return_map_jacobian, return_map_on_U, step_jacobians, trajectory_jacobians,
    )
    from dynlab.analysis.margin import binary_signed_error, decision_margin, margin_vs_group_order
    from dynlab.analysis.perturbation import perturbation_response
    from dynlab.analysis.fixed_points.slow_points import SlowPoints, find_slow_points

#: Public name -> the module that defines it, imported when the name is first read.
_EXPORTS = {
    "CorrelationResult": "dynlab.analysis.correlation",
    "FixedPoints": "dynlab.analysis.fixed_points.finder",
    "SlowPoints": "dynlab.analysis.fixed_points.slow_points",
    "analysis_copy": "dynlab.analysis.jacobian",
    "binary_signed_error": "dynlab.analysis.margin",
    "class_centroids": "dynlab.analysis.centroids",
    "crossing_time": "dynlab.analysis.geometry",
    "decision_margin": "dynlab.analysis.margin",
    "find_fixed_points": "dynlab.analysis.fixed_points.finder",
    "find_slow_points": "dynlab.analysis.fixed_points.slow_points",
    "geometry_over_time": "dynlab.analysis.geometry",
    "lyapunov_exponents": "dynlab.analysis.jacobian",
    "margin_vs_group_order": "dynlab.analysis.margin",
    "perturbation_response": "dynlab.analysis.perturbation",
    "readout_tau": "dynlab.analysis.geometry",
    "return_map_jacobian": "dynlab.analysis.jacobian",
    "return_map_on_U": "dynlab.analysis.jacobian",
    "step_jacobians": "dynlab.analysis.jacobian",
    "symbolic_basis": "dynlab.analysis.geometry",
    "tcross_mp_correlation": "dynlab.analysis.correlation",
    "trajectory_jacobians": "dynlab.analysis.jacobian",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
