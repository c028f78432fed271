"""What the figure tests measure on a drawn figure, with matplotlib's own extents: which
legend or text covers a plotted data point, and which text is set below a legible size.

Written apart from dynlab's own placement (``dynlab.figures.legends``) so that the tests
do not check that code with itself.

:func:`clipped_titles` finds a title that leaves its axes or the figure.

A *data point* is, in display coordinates: every vertex of a Line2D with a marker (its
marker's radius counted), every point along a Line2D drawn with a line style (reference
lines such as a chance level or the unit circle included: the path is sampled every
pixel), every offset of a scatter (PathCollection, its marker's radius counted), every
point along the segments of a LineCollection (error bars), the outline of an unfilled
patch (a circle), and every bar of a bar chart.  Filled areas (min–max bands, shaded
training ranges) and images are not points: a heatmap's value written on its cell is
its label, not something covering it.  Points outside their axes (clipped) are left out.
"""

from __future__ import annotations

import numpy as np
from matplotlib.collections import LineCollection, PathCollection
from matplotlib.container import BarContainer

#: Pixels a box may touch a point before it counts as covering it (anti-aliasing).
SLACK = 1.0


def renderer_of(fig):
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    if not hasattr(fig.canvas, "get_renderer"):
        FigureCanvasAgg(fig)
    return fig.canvas.get_renderer()


def _dense(xy: np.ndarray, step: float = 1.0) -> np.ndarray:
    """The points of the polyline ``xy`` (display pixels) every ``step`` pixels; a NaN breaks it."""
    if len(xy) < 2:
        return xy[np.isfinite(xy).all(axis=1)]
    a, b = xy[:-1], xy[1:]
    ok = np.isfinite(a).all(axis=1) & np.isfinite(b).all(axis=1)
    a, b = a[ok], b[ok]
    if not len(a):
        return np.empty((0, 2))
    n = np.maximum(1, np.ceil(np.hypot(*(b - a).T) / step).astype(int))
    n = np.minimum(n, 5000)
    seg = np.repeat(np.arange(len(a)), n)
    frac = np.concatenate([np.arange(k) / k for k in n])
    return np.vstack([a[seg] + (b[seg] - a[seg]) * frac[:, None], b[-1:]])


def _no_style(style) -> bool:
    return style in (None, "None", "none", "", " ")


def data_points(ax, fig) -> tuple[np.ndarray, np.ndarray, list]:
    """``(points [n, 2], radii [n], bars)``: the data points of ``ax`` in display pixels,
    each with the radius of its marker (0 on a line), and the display boxes of its bars."""
    pts, radii = [], []
    px = fig.dpi / 72.0
    for line in ax.lines:
        if not line.get_visible():
            continue
        xy = np.asarray(line.get_transform().transform(np.asarray(line.get_xydata(), dtype=float)), dtype=float)
        if not len(xy):
            continue
        if not _no_style(line.get_linestyle()) and len(xy) > 1:
            d = _dense(xy)
            pts.append(d)
            radii.append(np.zeros(len(d)))
        if not _no_style(line.get_marker()):
            fin = xy[np.isfinite(xy).all(axis=1)]
            pts.append(fin)
            radii.append(np.full(len(fin), line.get_markersize() * px / 2))
    for coll in ax.collections:
        if not coll.get_visible():
            continue
        if isinstance(coll, PathCollection):
            off = np.asarray(coll.get_offset_transform().transform(np.asarray(coll.get_offsets(), dtype=float)))
            sizes = np.asarray(coll.get_sizes(), dtype=float)
            r = np.sqrt(sizes if sizes.size else np.array([36.0])) * px / 2
            pts.append(off)
            radii.append(np.resize(r, len(off)))
        elif isinstance(coll, LineCollection):
            tr = coll.get_transform()
            for seg in coll.get_segments():
                d = _dense(np.asarray(tr.transform(np.asarray(seg, dtype=float))))
                pts.append(d)
                radii.append(np.zeros(len(d)))
    bars = [p for c in ax.containers if isinstance(c, BarContainer) for p in c.patches]
    for patch in ax.patches:
        if patch in bars or not patch.get_visible() or patch.get_fill():
            continue
        path = patch.get_transform().transform_path(patch.get_path())
        d = _dense(np.asarray(path.interpolated(64).vertices, dtype=float))
        pts.append(d)
        radii.append(np.zeros(len(d)))
    if pts:
        p, r = np.vstack(pts), np.concatenate(radii)
        box = ax.bbox
        inside = np.isfinite(p).all(axis=1) & (p[:, 0] >= box.x0 - 0.5) & (p[:, 0] <= box.x1 + 0.5) \
            & (p[:, 1] >= box.y0 - 0.5) & (p[:, 1] <= box.y1 + 0.5)
        p, r = p[inside], r[inside]
    else:
        p, r = np.empty((0, 2)), np.empty(0)
    boxes = [b.get_window_extent() for b in bars if b.get_visible() and b.get_width() and b.get_height()]
    return p, r, boxes


def _hits(box, pts: np.ndarray, radii: np.ndarray, bars: list) -> int:
    """How many of the points (and bars) ``box`` covers."""
    x0, y0, x1, y1 = box.x0 + SLACK, box.y0 + SLACK, box.x1 - SLACK, box.y1 - SLACK
    if x1 <= x0 or y1 <= y0:
        return 0
    dx = np.maximum(np.maximum(x0 - pts[:, 0], pts[:, 0] - x1), 0)
    dy = np.maximum(np.maximum(y0 - pts[:, 1], pts[:, 1] - y1), 0)
    n = int((np.hypot(dx, dy) < np.maximum(radii * 0.5, 0.0) + 1e-9).sum()) if len(pts) else 0
    n += sum(1 for b in bars if b.x0 < x1 and b.x1 > x0 and b.y0 < y1 and b.y1 > y0)
    return n


def _boxes(fig, renderer) -> list[tuple[str, object]]:
    """``(what, display box)`` of every legend and every text drawn on an axes (a heatmap's
    cell labels left out: an axes with an image)."""
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        legend = ax.get_legend()
        if legend is not None and legend.get_visible():
            out.append((f"legend of {ax.get_title() or ax.get_title(loc='left')!r}", legend.get_window_extent(renderer)))
        if ax.images:
            continue
        for text in ax.texts:
            if text.get_visible() and text.get_text().strip():
                out.append((f"text {text.get_text()[:40]!r} on {ax.get_title() or ax.get_title(loc='left')!r}",
                            text.get_window_extent(renderer)))
    for legend in fig.legends:
        out.append(("figure legend", legend.get_window_extent(renderer)))
    return out


def covered_points(fig, draw: bool = True) -> list[str]:
    """One line per legend or text of ``fig`` that covers a data point of any of its axes
    (how many points); empty when none does.  Draws the figure (its layout) first, unless
    ``draw`` is False (drawn already)."""
    renderer = renderer_of(fig)
    if draw:
        fig.draw_without_rendering()
    data = [data_points(ax, fig) for ax in fig.axes if ax.get_visible()]
    found = []
    for what, box in _boxes(fig, renderer):
        n = sum(_hits(box, *d) for d in data)
        if n:
            found.append(f"{what} covers {n} data points")
    return found


def small_text(fig, smallest: float = 6.0, draw: bool = True) -> list[str]:
    """Every text of ``fig`` (titles, labels, tick labels, legends, notes) drawn below
    ``smallest`` points at the figure's saved size."""
    if draw:
        fig.draw_without_rendering()
    out = []
    for text in fig.findobj(lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text")):
        if text.get_visible() and str(text.get_text()).strip() and text.get_fontsize() < smallest - 1e-9:
            out.append(f"{text.get_text()[:40]!r} at {text.get_fontsize():g} pt")
    return out


def clipped_titles(fig, draw: bool = True) -> list[str]:
    """Titles whose rendered extent leaves their axes (or the figure), by the renderer."""
    renderer = renderer_of(fig)
    if draw:
        fig.draw_without_rendering()
    width = fig.bbox.width
    out = []
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        box = ax.get_window_extent(renderer)
        for text in (ax.title, ax._left_title, ax._right_title):
            if not text.get_text():
                continue
            ext = text.get_window_extent(renderer)
            if ext.x0 < box.x0 - 1 or ext.x1 > box.x1 + 1 or ext.x0 < 0 or ext.x1 > width or ext.y1 > fig.bbox.height + 1:
                out.append(text.get_text())
    return out


def over_page(fig, width: float = 7.2, height: float = 9.5) -> bool:
    """Whether ``fig`` is larger than a two-column page allows (inches)."""
    w, h = fig.get_size_inches()
    return w > width + 1e-9 or h > height + 1e-9


__all__ = ["clipped_titles", "covered_points", "data_points", "over_page", "renderer_of", "small_text"]
