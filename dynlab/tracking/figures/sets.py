"""The panels each paper-A study declares (``Study.panels``): the group-tracking sweep's and
the nonlinearity ablation's, built from the panels of :mod:`dynlab.tracking.figures`."""

from __future__ import annotations

import xarray as xr

from dynlab.figures.panel import Panel, Table
from dynlab.tracking.figures.ablation import mp_by_nonlinearity, mp_failure_table
from dynlab.tracking.figures.dynamics import (
    failure_modes, fixed_point_spectra, margin_panel, perturbation_recovery, return_map_eigs,
)
from dynlab.tracking.figures.panels import (
    accuracy_heatmap, horizon_forecast_scatter, q_curves, r_par_perp, tcross_mp_scatter,
)

__all__ = ["group_tracking_panels", "nonlinearity_panels"]


def _groups(ds: xr.Dataset) -> list[str]:
    if "group" not in ds.coords:
        return []
    return list(dict.fromkeys(str(g) for g in ds["group"].values))


def group_tracking_panels(ds: xr.Dataset) -> dict[str, Panel | Table]:
    """The panels of a group-tracking dataset, in three figures (claims): the main one,
    whether the crossing time predicts where a tracker fails (q(t) and q_dec(t), T_cross vs
    mp for the default variant and q, the horizon forecast vs mp, R∥/R⊥); ``accuracy`` (a
    heatmap per group); ``dynamics`` (return-map eigenvalues at the centroids and at the
    fixed points, perturbation recovery, failure modes from q and q_dec, the margin per group)."""
    panels: dict[str, Panel | Table] = {f"accuracy_{g}": Panel(accuracy_heatmap, {"group": g}, "accuracy")
                                        for g in _groups(ds)}
    if not panels:
        panels["accuracy"] = Panel(accuracy_heatmap, figure="accuracy")
    panels.update(
        q_curves=Panel(q_curves),
        q_dec_curves=Panel(q_curves, {"variable": "q_dec"}),
        tcross_mp=Panel(tcross_mp_scatter),
        tcross_q_mp=Panel(tcross_mp_scatter, {"variant": "q"}),
        horizon_forecast=Panel(horizon_forecast_scatter),
        r_par_perp=Panel(r_par_perp),
        return_map_eigs=Panel(return_map_eigs, figure="dynamics"),
        fixed_point_spectra=Panel(fixed_point_spectra, figure="dynamics"),
        perturbation_recovery=Panel(perturbation_recovery, figure="dynamics"),
        failure_modes=Panel(failure_modes, figure="dynamics"),
        failure_modes_dec=Panel(failure_modes, {"variable": "failure_mode_dec"}, "dynamics"),
        margin=Panel(margin_panel, figure="dynamics"),
    )
    return panels


def nonlinearity_panels(ds: xr.Dataset) -> dict[str, Panel | Table]:
    """The panels of the nonlinearity ablation: mp per φ, failure modes per φ and the
    return-map eigenvalues (the main figure), accuracy heatmaps with a row per φ (figure
    ``accuracy``), q(t) per group coloured by φ (figure ``q``), and the Markdown table
    ``mp_table`` (:func:`~dynlab.tracking.figures.ablation.mp_failure_table`)."""
    groups = _groups(ds)
    panels: dict[str, Panel | Table] = {"mp_by_nonlinearity": Panel(mp_by_nonlinearity)}
    for g in groups:
        panels[f"accuracy_{g}"] = Panel(accuracy_heatmap, {"group": g, "by": "nonlinearity"}, "accuracy")
    panels["failure_modes"] = Panel(failure_modes, {"by": "nonlinearity"})
    for g in groups:
        panels[f"q_{g}"] = Panel(q_curves, {"group": g, "color_by": "nonlinearity"}, "q")
    panels["return_map_eigs"] = Panel(return_map_eigs, {"color_by": "nonlinearity"})
    panels["mp_table"] = Table(mp_failure_table)
    return panels
