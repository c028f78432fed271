"""The cell registry: built-in architectures plus any cell a user registers.

Register your own cell in a few lines::

    from dynlab.tracking.models import Cell, register_cell

    @register_cell("my-rnn")
    class MyRNN(Cell):
        family = "state-dependent"
        def __init__(self, d_in, hidden, nonlinearity=None, **kw):
            super().__init__(d_in, hidden, hidden, hidden, nonlinearity)
            self.A = torch.nn.Linear(hidden, hidden)
            self.B = torch.nn.Linear(d_in, hidden)
        def precompute(self, u):            # u [B, T, D]
            return {"drive": self.B(u)}
        def transition(self, h, p):         # h [B, S]
            return torch.tanh(self.A(h) + p["drive"])

It is then usable by name in specs, studies and the CLI, and ``dynlab models`` measures
its family with the Jacobian probe.

A subclass of a built-in cell (``TanhRNNCell`` with its own ``transition``, say) is
registered the same way.  Overriding any method drops the kernel class attributes
``fused`` and ``fast_scan`` it would inherit, so it trains through the generic loop over
``transition``, never through a kernel that computes the parent's recurrence; declare
them again in the class body only when the override keeps what the kernel computes
(:mod:`dynlab.tracking.models.cell_base`).
"""

from __future__ import annotations

from collections.abc import Callable

from dynlab.errors import DynlabInputError
from dynlab.names import CELLS, FAMILIES
from dynlab.tracking.models import cells
from dynlab.tracking.models.cell_base import Cell

__all__ = ["BUILTIN_ARCHS", "available_cells", "get_cell", "register_cell"]

_REGISTRY: dict[str, type[Cell]] = {}


def register_cell(name: str) -> Callable[[type[Cell]], type[Cell]]:
    """Class decorator that registers a :class:`Cell` subclass under ``name``."""

    def deco(cls: type[Cell]) -> type[Cell]:
        if not (isinstance(cls, type) and issubclass(cls, Cell)):
            raise TypeError(f"register_cell({name!r}) needs a Cell subclass, got {cls!r}")
        if cls.family not in FAMILIES:
            raise ValueError(f"cell {name!r} declares family {cls.family!r}; allowed: {', '.join(FAMILIES)}")
        _REGISTRY[name] = cls
        return cls

    return deco


def get_cell(name: str) -> type[Cell]:
    try:
        return _REGISTRY[name]
    except KeyError:
        raise DynlabInputError(f"unknown model {name!r}; allowed: {', '.join(available_cells())}") from None


def available_cells() -> list[str]:
    return list(_REGISTRY)


for _entry in CELLS:  # the built-in cells, from their one registration (dynlab.names.CELLS)
    register_cell(_entry.name)(getattr(cells, _entry.cls))

BUILTIN_ARCHS: tuple[str, ...] = tuple(_REGISTRY)
