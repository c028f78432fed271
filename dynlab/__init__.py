"""dynlab: dynamics of recurrent models — state tracking, length generalization, error control."""

from __future__ import annotations

from dynlab import _start

if _start.is_the_executable():  # Ctrl-C from the first moment: exit code 130 and one line (dynlab._start)
    _start.guard_start()

__version__ = "0.1.0"

# The public API, imported on first use so that light submodules (dynlab.figures,
# dynlab.tracking.groups) do not pull in torch.
_EXPORTS = {
    "Group": "dynlab.tracking.groups",
    "RunSpec": "dynlab.tracking.spec",
    "Study": "dynlab.study",
    "StudyOptions": "dynlab.study",
    "Tracker": "dynlab.tracking.models",
    "analyze_study": "dynlab.runner",
    "get_group": "dynlab.tracking.groups",
    "open_study": "dynlab.runner",
    "register_cell": "dynlab.tracking.models",
    "run_study": "dynlab.runner",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dynlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
