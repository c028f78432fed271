"""Names a package imports on first use (PEP 562), so that importing one module of dynlab
does not load every sub-package and the heavy libraries behind them.

A package lists its public names and the modules that define them, then::

    _EXPORTS = {"RecurrentLM": "dynlab.lm.models.model", ...}
    __all__ = list(_EXPORTS)
    __getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)

and imports the same names under ``if TYPE_CHECKING:`` for type checkers and the import
graph (tests/house/test_lazy_imports.py holds the two lists equal).  Standard library only.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["lazy_exports"]


def lazy_exports(package: str, exports: Mapping[str, str],
                 names: Iterable[str] | None = None) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The module ``__getattr__`` and ``__dir__`` of ``package``: a name of ``exports`` is
    read from its module (imported then) on first use; ``dir()`` lists ``names`` (default:
    the exported names); any other name is an ``AttributeError`` as for a plain module."""
    listed = sorted(exports if names is None else names)

    def __getattr__(name: str) -> Any:
        module = exports.get(name)
        if module is None:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        return getattr(importlib.import_module(module), name)

    def __dir__() -> list[str]:
        return list(listed)

    return __getattr__, __dir__
