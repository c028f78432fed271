"""Error-control analysis: pure functions from hidden states (or protocol models) to xarray.

``lm_metrics`` (PPL(t), EffRem, state statistics) is a sibling module imported directly.
Shared by both papers, this package imports neither (``dynlab.tracking``, ``dynlab.lm``):
paper A's per-run tracker analysis, which runs the trackers, is :mod:`dynlab.tracking.analysis`,
its fixed-point analysis per symbolic state (on the finder here) :mod:`dynlab.tracking.fixed_points`.
"""

from dynlab.analysis.correlation import CorrelationResult, tcross_mp_correlation
from dynlab.analysis.fixed_points import FixedPoints, find_fixed_points
from dynlab.analysis.slow_points import SlowPoints, find_slow_points
from dynlab.analysis.centroids import class_centroids
from dynlab.analysis.geometry import (
    crossing_time,
    geometry_over_time,
    readout_tau,
    symbolic_basis,
)
from dynlab.analysis.jacobian import (
    analysis_copy,
    lyapunov_exponents,
    return_map_jacobian,
    return_map_on_U,
    step_jacobians,
    trajectory_jacobians,
)
from dynlab.analysis.margin import binary_signed_error, decision_margin, margin_vs_group_order
from dynlab.analysis.perturbation import perturbation_response

__all__ = [
    "CorrelationResult",
    "FixedPoints",
    "SlowPoints",
    "analysis_copy",
    "binary_signed_error",
    "class_centroids",
    "crossing_time",
    "decision_margin",
    "find_fixed_points",
    "find_slow_points",
    "geometry_over_time",
    "lyapunov_exponents",
    "margin_vs_group_order",
    "perturbation_response",
    "readout_tau",
    "return_map_jacobian",
    "return_map_on_U",
    "step_jacobians",
    "symbolic_basis",
    "tcross_mp_correlation",
    "trajectory_jacobians",
]

