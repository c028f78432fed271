"""The training-loss panel of any study whose runs store their loss curve
(``train_loss_curve(run, loss_point)`` at the steps ``train_step``, with ``converged``;
:func:`dynlab.results.assemble.training_curves`): one line per run, coloured by arm,
runs that did not converge dashed, so a reader sees at once which runs learned."""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.lines import Line2D

from dynlab.figures.arms import PALETTE, arm_legend, run_arms
from dynlab.figures.panel import NothingToDraw, Panel, needs
from dynlab.figures.style import axis_label, log_axis

__all__ = ["training_loss_panel", "training_panels"]


@needs("train_loss_curve", "train_step", what="training loss")
def training_loss_panel(ds: xr.Dataset, ax: Axes) -> Axes:
    """Training loss against step, one line per run (one colour per arm, :func:`run_arms`);
    runs whose ``converged`` is False are dashed, and the legend says how many."""
    loss, step = ds["train_loss_curve"].values, ds["train_step"].values
    flags = ds["converged"].values.astype(bool) if "converged" in ds else np.ones(loss.shape[0], bool)
    handles, drawn = [], 0
    for i, (label, _, idx) in enumerate(run_arms(ds)):
        color = PALETTE[i % len(PALETTE)]
        for r in idx:
            keep = np.isfinite(loss[r]) & np.isfinite(step[r])
            if keep.any():
                ax.plot(step[r][keep], loss[r][keep], color=color, linewidth=0.8, linestyle="-" if flags[r] else "--")
                drawn += 1
        handles.append(Line2D([], [], color=color, label=label))
    if not drawn:
        raise NothingToDraw("no run holds a training-loss curve")
    n_bad = int((~flags).sum())
    if n_bad:
        handles.append(Line2D([], [], color="0.4", linestyle="--", label=f"not converged: {n_bad} of {flags.size}"))
    log_axis(ax, "y")  # a label per decade, as small as the loss goes (0.001, not 0.00)
    ax.set_xlabel(axis_label(ds["train_step"], "training step"))
    ax.set_ylabel(axis_label(ds["train_loss_curve"], "training loss"))
    ax.set_title("Training loss per run")
    # up to four entries inside, on the fewest curve points (beside the axes they would push a
    # heatmap column's colour bars off their panels in a task composite); past four beside
    arm_legend(ax, handles, band=False, inside_up_to=4)
    return ax


def training_panels(ds: xr.Dataset) -> dict[str, Panel]:
    """``{"training_loss": …}`` when ``ds`` holds loss curves, else nothing."""
    return {"training_loss": Panel(training_loss_panel)} if "train_loss_curve" in ds else {}
