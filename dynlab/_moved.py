"""The import paths of modules that moved, kept working.

Paper A's modules moved from the top of the package into ``dynlab/tracking/`` (and the
shared spec base into :mod:`dynlab.spec`); the kernels into one folder per op
(``dynlab.kernels.triton_scan`` is ``dynlab.kernels.scan.triton``; ``dynlab.kernels.scan``,
``ssd``, ``gla`` and ``selective_scan`` kept their names as packages).  Code, pickles and notebooks that name an old
path still work: ``import dynlab.models`` gives a small module whose attributes are those
of the new module (the same objects: ``dynlab.models.Tracker is
dynlab.tracking.models.Tracker``), and reading one warns with a ``DeprecationWarning``
naming the new path.  Run folders hold no module paths (a spec's hash reads its class
name only), so every run id stays the same.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from types import ModuleType
from typing import Any

__all__ = ["MOVED", "MOVED_NAMES", "install", "moved_name"]

#: Old module -> the modules that now hold its names, searched in order.
MOVED: dict[str, tuple[str, ...]] = {
    "dynlab.config": ("dynlab.spec", "dynlab.tracking.spec", "dynlab.errors"),
    "dynlab.groups": ("dynlab.tracking.groups",),
    "dynlab.tasks": ("dynlab.tracking.task",),
    "dynlab.tasks.word_problem": ("dynlab.tracking.task",),
    "dynlab.models": ("dynlab.tracking.models",),
    **{f"dynlab.models.{m}": (f"dynlab.tracking.models.{m}",)
       for m in ("cells", "nonlinearity", "probe", "registry", "streams", "tracker")},
    "dynlab.train": ("dynlab.tracking.train", "dynlab.training"),
    **{f"dynlab.train.{m}": (f"dynlab.tracking.train.{m}",) for m in ("budget", "engine", "ensemble")},
    "dynlab.evaluate": ("dynlab.tracking.evaluate",),
    "dynlab.tracking_runs": ("dynlab.tracking.run",),
    "dynlab.tracking_dataset": ("dynlab.tracking.dataset",),
    "dynlab.analysis.tracking": ("dynlab.tracking.analysis",),  # the shared analysis imports no paper's package
    # kernels/ by op
    **{f"dynlab.kernels.{old}": (f"dynlab.kernels.{new}",) for old, new in (
        ("triton_scan", "scan.triton"), ("triton_ssd", "ssd.triton"), ("triton_gla", "gla.triton"),
        ("dense_tracker", "tracker_loss.dense"), ("gated_tracker", "tracker_loss.gated"),
        ("diagonal_tracker", "tracker_loss.diagonal"), ("tracker_common", "tracker_loss.common"))},
}


#: Names that left a package which itself stayed: package -> {name: the module that now holds it}.
#: Paper A's tracker analysis runs the trackers, so it moved out of the shared ``dynlab.analysis``.
MOVED_NAMES: dict[str, dict[str, str]] = {
    "dynlab.analysis": {n: "dynlab.tracking.analysis" for n in ("AnalysisSpec", "analyze_tracker", "stream_states")},
}


def moved_name(package: str, name: str) -> Any:
    """``package.name`` for a name of :data:`MOVED_NAMES` (a package's module ``__getattr__``
    calls this), read from its new module with a ``DeprecationWarning``; AttributeError otherwise."""
    target = MOVED_NAMES.get(package, {}).get(name)
    if target is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    warnings.warn(f"{package}.{name} moved to {target}; import it from there", DeprecationWarning, stacklevel=3)
    return getattr(importlib.import_module(target), name)


def _load_run_spec(data: dict[str, Any] | str, cls: type | None = None) -> Any:
    """``dynlab.config.load_spec``: :func:`dynlab.spec.load_spec`, of a
    :class:`~dynlab.tracking.spec.RunSpec` unless ``cls`` says otherwise."""
    from dynlab.spec import load_spec
    from dynlab.tracking.spec import RunSpec

    return load_spec(data, RunSpec if cls is None else cls)


#: Names whose old meaning differs from the new module's: given as they were.
_KEPT: dict[str, dict[str, Any]] = {"dynlab.config": {"load_spec": _load_run_spec}}


class _MovedModule(ModuleType):
    """An old module path: its attributes are read from the new modules, with a warning."""

    def __getattr__(self, name: str) -> Any:
        if name == "__all__":  # ``from dynlab.config import *``: the public names of the new modules
            return sorted({n for t in MOVED[self.__name__] for n in getattr(importlib.import_module(t), "__all__", ())})
        if name.startswith("__"):
            raise AttributeError(name)
        targets = MOVED[self.__name__]
        warnings.warn(f"{self.__name__} moved to {' / '.join(targets)}; import {name} from there",
                      DeprecationWarning, stacklevel=2)
        if name in _KEPT.get(self.__name__, {}):
            return _KEPT[self.__name__][name]
        for target in targets:
            module = importlib.import_module(target)
            if hasattr(module, name):
                return getattr(module, name)
            try:  # a submodule of the new package
                return importlib.import_module(f"{target}.{name}")
            except ModuleNotFoundError:
                continue
        raise AttributeError(f"module {self.__name__!r} has no attribute {name!r}")

    def __dir__(self) -> list[str]:
        return sorted({n for t in MOVED[self.__name__] for n in dir(importlib.import_module(t))})


class _MovedFinder(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Finds the old paths of :data:`MOVED` (and nothing else)."""

    @classmethod
    def find_spec(cls, fullname: str, path: Any = None, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in MOVED:
            return None
        is_package = any(name.startswith(fullname + ".") for name in MOVED)
        return importlib.machinery.ModuleSpec(fullname, cls(), is_package=is_package)

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        module = _MovedModule(spec.name, f"Moved: the names of {', '.join(MOVED[spec.name])}.")
        return module

    def exec_module(self, module: ModuleType) -> None:
        if module.__spec__ is not None and module.__spec__.submodule_search_locations is not None:
            module.__path__ = []


def install() -> None:
    """Put the finder of the old paths first on ``sys.meta_path`` (once): a leftover folder
    of an old module (``dynlab/models/__pycache__``) must not shadow it."""
    if not any(isinstance(f, _MovedFinder) for f in sys.meta_path):
        sys.meta_path.insert(0, _MovedFinder())
