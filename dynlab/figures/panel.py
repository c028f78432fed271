"""Panels that declare the dataset variables they read.

A panel is a pure function ``(ds, ax, **options) -> ax`` decorated with :func:`needs`,
which names the variables (or coordinates) of the study dataset it reads.  A name may be
a template filled from the panel's options (``"{variable}"``) or a function
``(ds, options) -> name``.  The figure driver (:func:`dynlab.figures.write_figures`)
checks the declared names before it draws and skips the panel with a note when one is
absent; any other error inside a panel (a ``KeyError`` too) is a bug and propagates.

A panel may still find nothing to draw in variables that are present (no finished runs,
every value NaN, a requested group absent): it then raises :class:`NothingToDraw`, and
the driver draws it as an empty panel that says why (:func:`draw_empty`), so a figure
set always has the same files and panel letters, and notes it.  A :class:`Table` is the
same for a function ``(ds, **options) -> str`` of Markdown (an empty table is a line
saying why, :func:`empty_table`).
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import xarray as xr

__all__ = ["MissingData", "MissingVariables", "NothingToDraw", "Panel", "Table", "draw_empty", "empty_table", "needs",
           "required_variables"]


class MissingData(ValueError):
    """A panel cannot be drawn from this dataset (one line saying why)."""


class MissingVariables(MissingData):
    """Variables a panel declared (:func:`needs`) are absent from the dataset."""


class NothingToDraw(MissingData):
    """The declared variables are present, but hold nothing the panel can draw."""


Name = str | Callable[[xr.Dataset, Mapping[str, Any]], str]


def needs(*names: Name, what: str) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Declare the variables a panel (or table) reads; ``what`` names it in messages.

    Calling the decorated function on a dataset without them raises
    :class:`MissingVariables` (``"<what> needs a, b (absent from the dataset)"``).
    """

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(fn)
        def checked(ds: xr.Dataset, *args: Any, **kwargs: Any) -> Any:
            absent = missing_variables(checked, ds, *args, **kwargs)
            if absent:
                raise MissingVariables(f"{what} needs {', '.join(absent)} (absent from the dataset)")
            return fn(ds, *args, **kwargs)

        checked.needs = names  # type: ignore[attr-defined]
        checked.what = what  # type: ignore[attr-defined]
        return checked

    return decorate


def required_variables(fn: Callable[..., Any], ds: xr.Dataset, *args: Any, **kwargs: Any) -> list[str]:
    """The variables ``fn`` (decorated with :func:`needs`) reads when called as ``fn(ds, *args, **kwargs)``."""
    if not hasattr(fn, "needs"):
        raise TypeError(f"{getattr(fn, '__name__', fn)!r} declares no variables; decorate it with dynlab.figures.panel.needs")
    bound = inspect.signature(fn).bind_partial(ds, *args, **kwargs)
    bound.apply_defaults()
    options = dict(bound.arguments)
    out = [n(ds, options) if callable(n) else n.format(**options) for n in fn.needs]
    return list(dict.fromkeys(out))


def missing_variables(fn: Callable[..., Any], ds: xr.Dataset, *args: Any, **kwargs: Any) -> list[str]:
    """The declared variables of ``fn`` that ``ds`` lacks (in declaration order)."""
    return [n for n in required_variables(fn, ds, *args, **kwargs) if n not in ds.variables]


def _label(what: str, options: Mapping[str, Any]) -> str:
    """``what`` with the panel's options, e.g. ``accuracy heatmap (group=C2)``."""
    shown = ", ".join(f"{k}={v}" for k, v in options.items())
    return f"{what} ({shown})" if shown else what


def draw_empty(ax: Any, title: str, why: str, width: int = 44) -> Any:
    """Draw an empty panel on ``ax``: ``title`` as its title, ``"nothing to draw"`` and the
    reason ``why`` (wrapped at ``width`` characters) in grey in its middle, no ticks."""
    ax.set_xticks([])
    ax.set_yticks([])
    for side in ("top", "right", "left", "bottom"):
        ax.spines[side].set_visible(True)
        ax.spines[side].set_color("#bbbbbb")
    ax.set_title(title)
    text = "nothing to draw:\n" + textwrap.fill(why, width)
    ax.text(0.5, 0.5, text, transform=ax.transAxes, ha="center", va="center", color="#666666", fontsize=7)
    return ax


def empty_table(title: str, why: str) -> str:
    """The Markdown written for a table with nothing to tabulate: one line naming it and why."""
    return f"_{title}: nothing to tabulate ({why})_\n"


@dataclass(frozen=True)
class Panel:
    """One panel of a figure set: ``draw(ds, ax, **options)``, ``draw`` declared with :func:`needs`.

    ``figure`` names the composite figure (the claim) the panel is drawn in: panels of one
    ``figure`` are drawn together, ``""`` (the default) in the study's main composite."""

    draw: Callable[..., Any]
    options: Mapping[str, Any] = field(default_factory=dict)
    figure: str = ""

    def __post_init__(self) -> None:
        if not hasattr(self.draw, "needs"):
            raise TypeError(f"panel {getattr(self.draw, '__name__', self.draw)!r} declares no variables (use needs)")

    @property
    def what(self) -> str:
        return str(self.draw.what)  # type: ignore[attr-defined]

    @property
    def label(self) -> str:
        """What the panel shows, with its options (the title of its empty version)."""
        return _label(self.what, self.options)

    def missing(self, ds: xr.Dataset) -> list[str]:
        """Declared variables absent from ``ds``."""
        return missing_variables(self.draw, ds, None, **self.options)

    def __call__(self, ds: xr.Dataset, ax: Any) -> Any:
        return self.draw(ds, ax, **self.options)


@dataclass(frozen=True)
class Table:
    """A Markdown table of a figure set: ``make(ds, **options) -> str``, declared with :func:`needs`."""

    make: Callable[..., str]
    options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if not hasattr(self.make, "needs"):
            raise TypeError(f"table {getattr(self.make, '__name__', self.make)!r} declares no variables (use needs)")

    @property
    def what(self) -> str:
        return str(self.make.what)  # type: ignore[attr-defined]

    @property
    def label(self) -> str:
        return _label(self.what, self.options)

    def missing(self, ds: xr.Dataset) -> list[str]:
        return missing_variables(self.make, ds, **self.options)

    def __call__(self, ds: xr.Dataset) -> str:
        return self.make(ds, **self.options)
