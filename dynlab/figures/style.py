"""One publication style for every dynlab figure: sizes, fonts, colours, labels.

Sizes follow a two-column paper: a panel is one column wide (:data:`COLUMN_WIDTH`
inches; :data:`PAGE_WIDTH` when asked for), a composite figure two columns
(:data:`PAGE_WIDTH`) and at most a page high (:data:`PAGE_HEIGHT`).  Fonts are 6–8 pt
(never below :data:`MIN_FONT`) so text stays readable when a panel is printed at column
width.  Colours: one hue per family
(affine: blues/greens, state-dependent: reds/oranges) so an architecture's colour also
tells its family; :func:`arch_color` gives a stable colour per architecture name.
"""

from __future__ import annotations

import re
import textwrap
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import matplotlib as mpl
import numpy as np
import xarray as xr

from dynlab.names import CELLS

__all__ = [
    "COLUMN_WIDTH",
    "FAMILY_COLORS",
    "MIN_FONT",
    "PAGE_HEIGHT",
    "PAGE_PANEL_HEIGHT",
    "PAGE_WIDTH",
    "PANEL_HEIGHT",
    "ROW_HEIGHT",
    "RC",
    "arch_color",
    "axis_label",
    "family_color",
    "finite",
    "fit_titles",
    "log_axis",
    "titles",
    "publication_style",
    "renderer_of",
    "settle_layout",
]

COLUMN_WIDTH = 3.4  # inches, one column of a two-column paper
PAGE_WIDTH = 7.2  # inches, full text width
PAGE_HEIGHT = 9.5  # inches, the text height a figure may fill
PANEL_HEIGHT = 2.5  # inches, a panel at column width
PAGE_PANEL_HEIGHT = 3.2  # inches, a panel at page width
ROW_HEIGHT = 2.9  # inches, a row of a composite: three rows fill less than a page
MIN_FONT = 6.0  # points: no text of a figure is smaller

FAMILY_COLORS = {"affine": "#1f5fa8", "state-dependent": "#c8412b"}
_OTHER = "#555555"

# Known architectures, ordered affine first; each gets a colour from its family's ramp.
_ARCH_COLORS = {c.name: c.color for c in CELLS}
_FALLBACK = ("#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf", "#9467bd")

RC: dict[str, Any] = {
    "font.size": 8,
    "axes.titlesize": 8,
    "axes.labelsize": 8,
    "xtick.labelsize": 7,
    "ytick.labelsize": 7,
    "legend.fontsize": 6.5,
    "legend.frameon": True,  # a light box keeps a legend readable where it must sit on data
    "legend.framealpha": 0.8,
    "legend.edgecolor": "none",
    "legend.fancybox": False,
    "legend.handlelength": 1.6,
    "axes.spines.top": False,
    "axes.spines.right": False,
    "axes.linewidth": 0.6,
    "xtick.major.width": 0.6,
    "ytick.major.width": 0.6,
    "lines.linewidth": 1.0,
    "lines.markersize": 3.5,
    "savefig.dpi": 300,
    "pdf.fonttype": 42,
    "figure.dpi": 150,
}


@contextmanager
def publication_style() -> Iterator[None]:
    """Context in which matplotlib uses :data:`RC` (restored on exit)."""
    with mpl.rc_context(RC):
        yield


def log_axis(ax: Any, which: str = "x") -> None:
    """Log scale with plain-number labels on the decades; when fewer than two decades lie
    in view (a loss between 1.7 and 5.8 has none), the minor ticks 2, 3 and 5 of each
    decade are labelled too, so that the axis is never unlabelled."""
    from matplotlib.ticker import FuncFormatter

    axis = ax.xaxis if which == "x" else ax.yaxis
    (ax.set_xscale if which == "x" else ax.set_yscale)("log")

    def minor(v: float, _: Any) -> str:
        lo, hi = sorted(axis.get_view_interval())
        if not (lo > 0 and v > 0) or np.floor(np.log10(hi)) - np.ceil(np.log10(lo)) >= 1:  # two decades in view
            return ""
        lead = round(v / 10 ** np.floor(np.log10(v) + 1e-9))
        return f"{v:g}" if lead in (2, 3, 5) else ""

    axis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    axis.set_minor_formatter(FuncFormatter(minor))


def family_color(family: str) -> str:
    return FAMILY_COLORS.get(str(family), _OTHER)


def arch_color(arch: str) -> str:
    """Stable colour of an architecture (unknown names hash into a fallback palette)."""
    arch = str(arch)
    if arch in _ARCH_COLORS:
        return _ARCH_COLORS[arch]
    return _FALLBACK[sum(arch.encode()) % len(_FALLBACK)]


def axis_label(da: xr.DataArray | xr.Variable | Any, fallback: str = "", width: int = 38) -> str:
    """``long_name [units]`` from a variable's attrs (units '1' and '' are left out; a
    trailing parenthetical remark is dropped; wrapped at ``width`` characters)."""
    attrs = getattr(da, "attrs", {}) or {}
    name = str(attrs.get("long_name") or fallback or getattr(da, "name", "") or "")
    name = re.sub(r"\s*\([^()]*\)$", "", name) or name  # a trailing remark "(NaN = censored)" is for docs
    units = str(attrs.get("units", "") or "")
    repeats = units.rstrip("s").lower() == name.rstrip("s").lower()  # "step [step]" says nothing twice
    text = f"{name} [{units}]" if units and units != "1" and not repeats else name
    return "\n".join(textwrap.wrap(text, width)) if len(text) > width else text


def finite(values: Any) -> np.ndarray:
    """Float array of ``values`` with non-finite entries removed."""
    a = np.asarray(values, dtype=np.float64).ravel()
    return a[np.isfinite(a)]


def titles(ax: Any) -> list[Any]:
    """The title texts of ``ax`` that hold text (centre, left, right)."""
    return [t for t in (ax.title, ax._left_title, ax._right_title) if t.get_text()]


def _width(text: Any, renderer: Any) -> float:
    return float(text.get_window_extent(renderer).width)


def _wrap_title(text: Any, width: float, renderer: Any) -> None:
    """Break ``text`` at spaces so each line is at most ``width`` pixels; a word alone wider
    than that shrinks the font (down to :data:`MIN_FONT`)."""
    words = text.get_text().split()
    lines: list[str] = []
    for word in words:
        candidate = f"{lines[-1]} {word}" if lines else word
        text.set_text(candidate)
        if lines and _width(text, renderer) <= width:
            lines[-1] = candidate
        elif lines:
            lines.append(word)
        else:
            lines = [word]
    text.set_text("\n".join(lines))
    while _width(text, renderer) > width and text.get_fontsize() > MIN_FONT:
        text.set_fontsize(text.get_fontsize() - 0.5)


def renderer_of(fig: Any) -> Any:
    """The renderer that measures ``fig``'s text (an Agg canvas is attached to a figure made
    without pyplot; saving to PDF still picks its own)."""
    if not hasattr(fig.canvas, "get_renderer"):
        from matplotlib.backends.backend_agg import FigureCanvasAgg

        FigureCanvasAgg(fig)
    return fig.canvas.get_renderer()


def settle_layout(fig: Any, tries: int = 8) -> None:
    """Draw ``fig`` (without rendering) until its axes stop moving: a constrained layout
    whose legends or texts are anchored to their axes takes a few passes to settle; any
    other figure is drawn once."""
    from matplotlib.layout_engine import ConstrainedLayoutEngine

    before = None
    for _ in range(tries if isinstance(fig.get_layout_engine(), ConstrainedLayoutEngine) else 1):
        fig.draw_without_rendering()
        now = [tuple(ax.get_position().bounds) for ax in fig.axes]
        if before is not None and np.allclose(now, before, rtol=0, atol=5e-4):
            break
        before = now


def inner_text_out_of_layout(fig: Any) -> None:
    """Leave the legends and texts placed inside an axes out of ``fig``'s constrained
    layout: they are drawn on the axes and take no margin.  A legend or a statistics line
    that is wider than a narrow axes would otherwise count as a margin, which grows as the
    axes shrinks until the layout gives up ("axes sizes collapsed to zero").  Legends
    anchored outside their axes (``bbox_to_anchor``) and texts outside ``[0, 1]²`` in
    axes coordinates keep their place in the layout."""
    for ax in fig.axes:
        legend = ax.get_legend()
        if legend is not None and legend.get_bbox_to_anchor() is ax.bbox:
            legend.set_in_layout(False)
        for text in ax.texts:
            x, y = text.get_position()
            if text.get_transform() == ax.transAxes and 0 <= x <= 1 and 0 <= y <= 1:
                text.set_in_layout(False)


def fit_titles(fig: Any, tries: int = 3) -> Any:
    """Wrap every axes title of ``fig`` that is wider than its axes (measured with the
    figure's renderer after a layout pass), so none is clipped or runs over a neighbour.
    Legends and texts inside an axes are first left out of the layout
    (:func:`inner_text_out_of_layout`)."""
    inner_text_out_of_layout(fig)
    renderer = renderer_of(fig)
    engine = fig.get_layout_engine()
    if engine is not None:  # a first pass without the layout: a too-wide title makes it collapse
        fig.set_layout_engine("none")
    for n in range(tries + 1):
        if n == 1 and engine is not None:
            fig.set_layout_engine(engine)
        settle_layout(fig)
        changed = False
        for ax in fig.axes:
            if not ax.get_visible():
                continue
            width = ax.get_window_extent(renderer).width
            for text in titles(ax):
                if _width(text, renderer) > width + 0.5:
                    _wrap_title(text, width, renderer)
                    changed = True
        if not changed and n > 0:
            break
    return fig
