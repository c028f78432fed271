"""The training-loss panel: one line per run at its own steps, one colour per arm, the runs
that did not converge dashed and counted."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import xarray as xr

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from dynlab.figures.panel import MissingVariables, NothingToDraw  # noqa: E402
from dynlab.figures.training import training_loss_panel, training_panels  # noqa: E402
from dynlab.results.assemble import training_curves  # noqa: E402
from dynlab.runner.protocol import RunResult  # noqa: E402


def _dataset() -> xr.Dataset:
    runs = [RunResult(status="ok", loss_curve_step=[10, 20, 30], loss_curve=[3.0, 2.0, 1.5], converged=True),
            RunResult(status="ok", loss_curve_step=[10, 20, 30], loss_curve=[3.1, 2.1, 1.6], converged=True),
            RunResult(status="ok", loss_curve_step=[5, 10], loss_curve=[4.0, 3.9], converged=False)]
    ds = training_curves(runs).assign_coords(run=[0, 1, 2], intervention=("run", ["zero", "zero", "tbtt"]))
    return ds


def test_lines_per_run_at_their_own_steps_not_converged_dashed():
    ax = training_loss_panel(_dataset(), Figure().add_subplot())
    lines = [ln for ln in ax.get_lines()]
    assert [ln.get_xdata().tolist() for ln in lines] == [[10, 20, 30], [10, 20, 30], [5, 10]]
    np.testing.assert_allclose(lines[2].get_ydata(), [4.0, 3.9], rtol=0, atol=0)
    assert [ln.get_linestyle() for ln in lines] == ["-", "-", "--"]
    assert lines[0].get_color() == lines[1].get_color() != lines[2].get_color()  # one colour per arm
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert labels == ["zero", "tbtt", "not converged: 1 of 3"]


def test_panel_only_where_curves_exist():
    assert set(training_panels(_dataset())) == {"training_loss"}
    assert training_panels(xr.Dataset()) == {}
    with pytest.raises(MissingVariables, match="training loss needs"):
        training_loss_panel(xr.Dataset(), Figure().add_subplot())
    empty = _dataset()
    empty["train_loss_curve"][:] = np.nan
    with pytest.raises(NothingToDraw):
        training_loss_panel(empty, Figure().add_subplot())


def test_loss_axis_labels_every_decade_distinctly():
    """A loss that falls to 1e-4 gets a distinct label per decade (fixed decimals would
    print 0.001 and 0.0001 both as 0.00)."""
    runs = [RunResult(status="ok", loss_curve_step=[1, 2, 3, 4], loss_curve=[5.0, 0.1, 1e-3, 1e-4], converged=True)]
    ds = training_curves(runs).assign_coords(run=[0], intervention=("run", ["zero"]))
    fig = Figure()
    ax = training_loss_panel(ds, fig.add_subplot())
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [(t.get_position()[1], t.get_text()) for t in ax.get_yticklabels() if lo <= t.get_position()[1] <= hi]
    texts = [text for _, text in shown]
    assert len(texts) >= 4 and len(set(texts)) == len(texts), texts
    for value, text in shown:  # each label reads back as its tick's value
        assert float(text.replace("\u2212", "-")) == pytest.approx(value, rel=1e-9)


def test_loss_axis_within_one_decade_is_labelled():
    """A loss between 1.7 and 5.8 holds no decade: the 2, 3 and 5 ticks carry the labels."""
    runs = [RunResult(status="ok", loss_curve_step=[1, 2, 3], loss_curve=[5.8, 3.0, 1.7], converged=True)]
    ds = training_curves(runs).assign_coords(run=[0], intervention=("run", ["zero"]))
    fig = Figure()
    ax = training_loss_panel(ds, fig.add_subplot())
    fig.canvas.draw()
    lo, hi = ax.get_ylim()
    shown = [(t.get_position()[1], t.get_text()) for t in (*ax.get_yticklabels(), *ax.get_yticklabels(minor=True))
             if lo <= t.get_position()[1] <= hi and t.get_text()]
    assert sorted(float(text) for _, text in shown) == [2.0, 3.0, 5.0]
    for value, text in shown:
        assert float(text) == pytest.approx(value, rel=1e-9)


def test_many_arms_put_the_legend_beside_the_axes_off_the_curves():
    """Past four entries the legend is anchored right of the axes, where no curve runs
    (inside, loc='best' covered the start of the base run's curve in a composite); up to
    four it sits inside, on no curve's points."""
    arms = ["zero", "random-noise", "fitted-noise", "state-passing", "tbtt"]
    runs = [RunResult(status="ok", loss_curve_step=[1, 2, 3], loss_curve=[5.0 - i, 3.0, 2.0], converged=True)
            for i, _ in enumerate(arms)]
    ds = training_curves(runs).assign_coords(run=list(range(5)), intervention=("run", arms))
    fig = Figure()
    ax = training_loss_panel(ds, fig.add_subplot())
    legend = ax.get_legend()
    assert [t.get_text() for t in legend.get_texts()] == arms
    fig.canvas.draw()
    assert legend.get_window_extent().x0 >= ax.get_window_extent().x1  # wholly right of the axes
    fig = Figure()
    few = training_loss_panel(_dataset(), fig.add_subplot())
    fig.canvas.draw()
    box, frame = few.get_legend().get_window_extent(), few.get_window_extent()
    assert frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
    points = np.vstack([few.transData.transform(ln.get_xydata()) for ln in few.get_lines()])
    inside = (points[:, 0] >= box.x0) & (points[:, 0] <= box.x1) & (points[:, 1] >= box.y0) & (points[:, 1] <= box.y1)
    assert not inside.any()
