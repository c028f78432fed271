"""Legends that cover no data: placed after the figure's layout, where they hide nothing.

A panel makes its legend with :func:`legend` (``ax.legend`` that remembers its entries
and says on which side of the axes it may go when no place inside is free:
``beside="below"`` or ``"right"``).  Once the figure is laid out, :func:`fit_legends`
measures, with the figure's renderer, every legend drawn inside an axes against the
data points of every axes of the figure (:func:`data_points`: markers, lines sampled
every pixel, reference lines and unfilled outlines such as the unit circle, bars;
filled bands and images are areas, not points).  A legend that covers a point is moved
to the first of the inside places (:data:`LOCS`) that covers none, and when none is
free, out of the axes: below its x axis (in as many columns as fit the axes' width) or
right of it (labels wrapped to :data:`RIGHT_WRAP` characters), where the layout makes
room for it.  :func:`fit_figure` runs this with :func:`~dynlab.figures.style.fit_titles`
on a figure the driver writes.  No torch, no file I/O.
"""

from __future__ import annotations

import textwrap
from typing import Any

import numpy as np
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.container import BarContainer
from matplotlib.transforms import ScaledTranslation

from dynlab.figures.style import fit_titles, renderer_of, settle_layout

__all__ = ["LOCS", "RIGHT_WRAP", "data_points", "fit_figure", "fit_legends", "legend"]

#: The places inside an axes a legend is tried at, in order, when where it was put covers data.
LOCS = ("upper right", "upper left", "lower right", "lower left", "center right", "center left", "upper center",
        "lower center", "center")

#: The widest label (characters a line) of a legend moved right of its axes.
RIGHT_WRAP = 26

#: Pixels a legend may overlap a point before it counts as covering it (anti-aliasing).
_SLACK = 1.0


def legend(ax: Any, handles: list | None = None, labels: list[str] | None = None, *, beside: str = "below",
           **kw: Any) -> Any:
    """``ax.legend(handles, labels, **kw)`` (default: the axes' labelled artists, at
    matplotlib's best place) that :func:`fit_legends` may move, out of the axes to
    ``beside`` ("below" or "right") when no place inside is free."""
    if beside not in ("below", "right"):
        raise ValueError(f"beside must be 'below' or 'right', got {beside!r}")
    if handles is None:
        handles, labels = ax.get_legend_handles_labels()
    elif labels is None:
        labels = [h.get_label() for h in handles]
    kw.setdefault("loc", "best")
    made = ax.legend(list(handles), list(labels), **kw)
    made._dynlab_entries = (list(handles), list(labels), dict(kw), beside)
    return made


def _dense(xy: np.ndarray) -> np.ndarray:
    """The points along the polyline ``xy`` (display pixels), one a pixel; NaN breaks it."""
    if len(xy) < 2:
        return xy
    a, b = xy[:-1], xy[1:]
    ok = np.isfinite(a).all(axis=1) & np.isfinite(b).all(axis=1)
    a, b = a[ok], b[ok]
    if not len(a):
        return np.empty((0, 2))
    n = np.clip(np.ceil(np.hypot(*(b - a).T)).astype(int), 1, 4000)
    seg = np.repeat(np.arange(len(a)), n)
    frac = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
    return np.vstack([a[seg] + (b[seg] - a[seg]) * (frac / n[seg])[:, None], b[-1:]])


def _drawn(style: Any) -> bool:
    return style not in (None, "None", "none", "", " ")


def data_points(ax: Any) -> tuple[np.ndarray, np.ndarray, list]:
    """The data of ``ax`` in display pixels: ``(points [n, 2], their marker radii [n],
    the boxes of its bars)``; points outside the axes (clipped) are left out."""
    pts, radii = [np.empty((0, 2))], [np.empty(0)]
    scale = ax.figure.dpi / 72.0

    def add(xy: np.ndarray, radius: float | np.ndarray = 0.0) -> None:
        xy = np.asarray(xy, dtype=float).reshape(-1, 2)
        pts.append(xy)
        radii.append(np.broadcast_to(np.asarray(radius, dtype=float), (len(xy),)))

    for line in ax.lines:
        if line.get_visible():
            xy = line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float).reshape(-1, 2))
            if _drawn(line.get_linestyle()):
                add(_dense(xy))
            if _drawn(line.get_marker()):
                add(xy, line.get_markersize() * scale / 2)
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection) and len(coll.get_offsets()):
            xy = coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), dtype=float))
            sizes = np.asarray(coll.get_sizes(), dtype=float)
            add(xy, np.resize(np.sqrt(sizes if sizes.size else [36.0]) * scale / 2, len(xy)))
        elif isinstance(coll, LineCollection):
            for seg in coll.get_segments():
                add(_dense(coll.get_transform().transform(np.asarray(seg, dtype=float))))
    bars = [p for c in ax.containers if isinstance(c, BarContainer) for p in c.patches]
    for patch in ax.patches:
        if patch.get_visible() and not patch.get_fill() and patch not in bars:  # an outline: the unit circle
            add(_dense(patch.get_transform().transform_path(patch.get_path()).interpolated(64).vertices))
    p, r = np.vstack(pts), np.concatenate(radii)
    box = ax.bbox
    keep = (np.isfinite(p).all(axis=1) & (p[:, 0] >= box.x0 - 0.5) & (p[:, 0] <= box.x1 + 0.5)
            & (p[:, 1] >= box.y0 - 0.5) & (p[:, 1] <= box.y1 + 0.5))
    return p[keep], r[keep], [b.get_window_extent() for b in bars if b.get_visible() and b.get_width() and b.get_height()]


def text_boxes(ax: Any, renderer: Any) -> list:
    """The display boxes of the notes written on ``ax`` (``ax.text``, ``ax.annotate``): a
    legend covers none of them either.  The values written on a heatmap's cells are left out."""
    if ax.images:
        return []
    return [t.get_window_extent(renderer) for t in ax.texts if t.get_visible() and t.get_text().strip()]


def covers(box: Any, data: list[tuple[np.ndarray, np.ndarray, list]]) -> bool:
    """Whether the display box ``box`` covers any point or box of ``data`` (:func:`data_points`
    of each axes: points, their radii, boxes of bars and notes)."""
    x0, y0, x1, y1 = box.x0 + _SLACK, box.y0 + _SLACK, box.x1 - _SLACK, box.y1 - _SLACK
    for pts, radii, bars in data:
        dx = np.maximum(np.maximum(x0 - pts[:, 0], pts[:, 0] - x1), 0)
        dy = np.maximum(np.maximum(y0 - pts[:, 1], pts[:, 1] - y1), 0)
        if (np.hypot(dx, dy) <= radii / 2).any():
            return True
        if any(b.x0 < x1 and b.x1 > x0 and b.y0 < y1 and b.y1 > y0 for b in bars):
            return True
    return False


def _inside(ax: Any, made: Any) -> bool:
    return made.get_bbox_to_anchor() is ax.bbox


def _entries(made: Any) -> tuple[list, list[str], dict, str]:
    """The entries a legend was made with (:func:`legend`), or, for one made by
    ``ax.legend`` directly, its own handles and texts."""
    if hasattr(made, "_dynlab_entries"):
        return made._dynlab_entries
    title = made.get_title().get_text()
    return (list(made.legend_handles), [t.get_text() for t in made.get_texts()],
            {"title": title or None, "fontsize": made.get_texts()[0].get_fontsize() if made.get_texts() else None},
            "below")


def _wrapped(labels: list[str], width: int) -> list[str]:
    return ["\n".join(textwrap.fill(line, width) for line in label.split("\n")) for label in labels]


def _outside(ax: Any, made: Any, renderer: Any, most: int | None = None) -> Any:
    """Move ``made`` out of ``ax``: right of it, or below its x axis in as many columns (at
    most ``most``) as fit the axes' width (its entries as :func:`_entries` gives them)."""
    handles, labels, kw, beside = _entries(made)
    kw = {k: v for k, v in kw.items() if k not in ("loc", "bbox_to_anchor", "bbox_transform", "ncols", "ncol")}
    kw = {k: v for k, v in kw.items() if v is not None}
    if beside == "right":
        if kw.get("title"):
            kw["title"] = _wrapped([kw["title"]], RIGHT_WRAP)[0]
        moved = ax.legend(handles, _wrapped(labels, RIGHT_WRAP), loc="upper left", bbox_to_anchor=(1.02, 1.0),
                          borderaxespad=0.0, **kw)
    else:
        axis = ax.xaxis.get_tightbbox(renderer)
        gap = (ax.bbox.y0 - axis.y0 if axis is not None else 0.0) / ax.figure.dpi + 0.04  # inches under the x axis
        shift = ax.transAxes + ScaledTranslation(0, -gap, ax.figure.dpi_scale_trans)
        for ncols in range(max(1, min(len(labels), most or len(labels))), 0, -1):
            moved = ax.legend(handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), bbox_transform=shift,
                              borderaxespad=0.0, ncols=ncols, **kw)
            if moved.get_window_extent(renderer).width <= ax.bbox.width or ncols == 1:
                break
    moved._dynlab_entries = (handles, labels, kw, beside)
    moved._dynlab_ncols = ncols if beside == "below" else 1
    moved.set_in_layout(True)
    return moved


def _narrower(ax: Any, made: Any, renderer: Any) -> bool:
    """A legend moved below ``ax`` that has grown wider than the axes (the layout narrowed
    it after the legend was placed) in fewer columns; whether it changed."""
    ncols = getattr(made, "_dynlab_ncols", 1)
    if ncols <= 1 or made.get_window_extent(renderer).width <= ax.bbox.width:
        return False
    _outside(ax, made, renderer, most=ncols - 1)
    return True


def fit_legends(fig: Any, tries: int = 4, settled: bool = False) -> bool:
    """Move every legend inside an axes of ``fig`` that covers a data point (module
    docstring); the figure is laid out again after a legend left its axes (and first,
    unless ``settled``: just laid out).  Whether any moved."""
    renderer = renderer_of(fig)
    moved_any = False
    for n in range(tries):
        if n or not settled:
            settle_layout(fig)
        axes = [ax for ax in fig.axes if ax.get_visible()]
        data = [(pts, radii, bars + text_boxes(ax, renderer)) for ax, (pts, radii, bars) in
                zip(axes, map(data_points, axes))]
        moved = False
        for ax in axes:
            made = ax.get_legend()
            if made is None or not made.get_visible():
                continue
            if not _inside(ax, made):
                moved |= _narrower(ax, made, renderer)
                continue
            if not covers(made.get_window_extent(renderer), data):
                continue
            for loc in LOCS:
                made.set_loc(loc)
                if not covers(made.get_window_extent(renderer), data):
                    break
            else:
                _outside(ax, made, renderer)
                moved = True
        if not moved:
            break
        moved_any = True
    return moved_any


def fit_figure(fig: Any) -> Any:
    """``fig`` ready to write: titles fitted to their axes, legends off the data
    (:func:`fit_legends`), titles fitted again where a legend that left its axes narrowed it."""
    fit_titles(fig)  # ends laid out
    if fit_legends(fig, settled=True):
        before = _titles(fig)
        fit_titles(fig)
        if _titles(fig) != before:  # a title wrapped again: the layout moved, the legends are looked at again
            fit_legends(fig)
    return fig


def _titles(fig: Any) -> list[str]:
    return [t.get_text() for ax in fig.axes for t in (ax.title, ax._left_title, ax._right_title)]
