"""dynlab: dynamics of recurrent models — state tracking, length generalization, error control."""

try:  # Ctrl-C from the first moment: exit code 130 and one line (dynlab._start)
    from dynlab import _start

    if _start.is_the_executable():
        _start.guard_start()
except KeyboardInterrupt:  # before the guard was in place (while _start, or signal, was imported)
    import os as _os
    import sys as _sys

    if _os.path.basename(_sys.argv[0] if _sys.argv else "") in ("dynlab", "dynlab.exe"):  # _start.is_the_executable
        _os.write(2, b"interrupted\n")
        _os._exit(130)
    raise

__version__ = "0.1.0"

# The public API, imported on first use so that light submodules (dynlab.figures,
# dynlab.tracking.groups) do not pull in torch.
_EXPORTS = {
    "Group": "dynlab.tracking.groups",
    "RunSpec": "dynlab.tracking.spec",
    "Stacking": "dynlab.runner.protocol",
    "Study": "dynlab.runner.protocol",
    "StudyOptions": "dynlab.runner.protocol",
    "Tracker": "dynlab.tracking.models",
    "analyze_study": "dynlab.runner.driver",
    "get_group": "dynlab.tracking.groups",
    "open_study": "dynlab.runner.driver",
    "register_cell": "dynlab.tracking.models",
    "run_study": "dynlab.runner.driver",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str):
    if name in _EXPORTS:
        import importlib

        return getattr(importlib.import_module(_EXPORTS[name]), name)
    raise AttributeError(f"module 'dynlab' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(__all__)
