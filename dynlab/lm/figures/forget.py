"""The ``state`` preset's figure: where small LMs learn to forget.

:func:`forget_map_panel`: far/in over (state size, T_train), the mean over the seeds that
learned, as a heatmap centred on 1, each cell's value and how many seeds rose written in
it, and T_forget (:mod:`dynlab.lm.report.forget`; median over seeds) as the line it draws
through the map; a threshold the grid does not bracket (censored) sits on the map's edge
as a filled arrow, and the title says what it stands for. :func:`forget_horizon_panel`
beside it: the state map's memory horizon over T_train (``memory_horizon``,
:mod:`dynlab.lm.analysis.contraction`), median over seeds, on a log colour scale: above 1 the state
keeps what it saw for longer than it was trained on.
"""

from __future__ import annotations

import numpy as np
import xarray as xr
from matplotlib.axes import Axes
from matplotlib.colors import LogNorm, TwoSlopeNorm

from dynlab.figures.panel import needs
from dynlab.lm.report.forget import forget_grid, forget_thresholds
from dynlab.lm.report.tables import RISE

__all__ = ["forget_horizon_panel", "forget_map_panel"]


def _ink(image, value: float) -> str:
    """Black on a light cell of ``image``, white on a dark one: a value written on its cell stays readable."""
    r, g, b, _ = image.cmap(image.norm(value))
    return "k" if 0.299 * r + 0.587 * g + 0.114 * b > 0.5 else "w"


def _grid_axes(ax: Axes, grid: xr.Dataset) -> tuple[np.ndarray, np.ndarray]:
    sizes, lengths = grid["state_size"].values, grid["train_length"].values
    ax.set_xticks(range(len(lengths)), [str(int(t)) for t in lengths])
    ax.set_yticks(range(len(sizes)), [f"{int(s):,}" for s in sizes])
    ax.set_xlabel("training length T_train [tokens]")
    ax.set_ylabel("recurrent state size [entries]")
    return sizes, lengths


@needs("state_size", "train_length", "status", what="forget map")
def forget_map_panel(ds: xr.Dataset, ax: Axes) -> Axes:
    """far/in heatmap with the T_forget line (module docstring)."""
    grid = forget_grid(ds)
    ratio = grid["ratio"].where(grid["learned"]).transpose("state_size", "train_length", "seed")
    mean = ratio.mean("seed").values
    sizes, lengths = _grid_axes(ax, grid)
    finite = mean[np.isfinite(mean)]
    top = max(1.3, float(finite.max()) if finite.size else 1.3)
    image = ax.imshow(mean, origin="lower", cmap="RdBu_r", aspect="auto",
                      norm=TwoSlopeNorm(vcenter=1.0, vmin=min(0.9, float(finite.min()) if finite.size else 0.9), vmax=top))
    rose = (ratio > RISE).sum("seed").values
    n = np.isfinite(ratio).sum("seed").values
    for i, j in np.ndindex(mean.shape):
        if np.isfinite(mean[i, j]):
            ax.text(j, i, f"{mean[i, j]:.2f}\n{rose[i, j]}/{n[i, j]}", ha="center", va="center", fontsize=6,
                    color=_ink(image, mean[i, j]))
    xs = _threshold_positions(grid, sizes, lengths)
    ax.plot(xs, range(len(sizes)), color="k", marker="|", markersize=8, linewidth=1.2, clip_on=False, zorder=3)
    title = "Far/in over state size and T_train\n(line: T_forget"
    for edge, marker, words in ((-0.5, "<", f"◀ censored, ≤ {int(lengths[0])}"),
                                (len(lengths) - 0.5, ">", f"▶ censored, > {int(lengths[-1])}")):
        rows = [i for i, x in enumerate(xs) if x == edge]
        if rows:  # a threshold the grid does not bracket sits on the map's edge: a filled arrow shows it
            ax.plot([edge] * len(rows), rows, linestyle="none", marker=marker, color="k", markersize=5, clip_on=False,
                    zorder=4)
            title += f"; {words}"
    ax.figure.colorbar(image, ax=ax, label="far/in PPL", shrink=0.8)
    ax.set_title(title + ")")
    return ax


def _threshold_positions(grid: xr.Dataset, sizes: np.ndarray, lengths: np.ndarray) -> list[float]:
    """Per state size, the x of T_forget's median over seeds on the map: the boundary before
    the cell of T_forget, a threshold censored below at the left edge (−0.5), one censored
    above at the right edge."""
    th = forget_thresholds(grid)
    xs = []
    for s in sizes:
        t = th["t_forget"].sel(state_size=s).values
        cens = th["censored"].sel(state_size=s).values
        pos = [np.searchsorted(lengths, v) - 0.5 for v in t[np.isfinite(t)]]
        pos += [-0.5] * int((cens == "below").sum()) + [len(lengths) - 0.5] * int((cens == "above").sum())
        xs.append(float(np.median(pos)) if pos else np.nan)
    return xs


@needs("state_size", "train_length", "memory_horizon", what="memory horizon map")
def forget_horizon_panel(ds: xr.Dataset, ax: Axes) -> Axes:
    """memory_horizon / T_train heatmap (module docstring)."""
    grid = forget_grid(ds)
    rel = (grid["memory_horizon"] / grid["train_length"]).where(grid["learned"])
    med = rel.median("seed").transpose("state_size", "train_length").values
    _grid_axes(ax, grid)
    finite = med[np.isfinite(med) & (med > 0)]
    lo, hi = (float(finite.min()), float(finite.max())) if finite.size else (0.1, 10.0)
    image = ax.imshow(med, origin="lower", cmap="viridis", aspect="auto", norm=LogNorm(vmin=min(lo, 0.99), vmax=max(hi, 1.01)))
    for i, j in np.ndindex(med.shape):
        if np.isfinite(med[i, j]):
            ax.text(j, i, f"{med[i, j]:.2g}", ha="center", va="center", fontsize=6, color=_ink(image, med[i, j]))
    ax.figure.colorbar(image, ax=ax, label="memory horizon / T_train", shrink=0.8)
    ax.set_title("The state map's memory horizon")
    return ax
