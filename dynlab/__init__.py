"""dynlab: dynamics of recurrent models — state tracking, length generalization, error control."""

from __future__ import annotations

from pathlib import Path as _Path

__version__ = "0.1.0"

# In a source checkout the sibling folders ``kernels/``, ``studies/`` and ``cli.py`` are
# installed as ``dynlab.kernels``, ``dynlab.studies`` and ``dynlab.cli`` (see
# pyproject.toml).  When dynlab is imported straight from the checkout (``python -m
# pytest`` at the repository root, or an editable install), make those names resolve the
# same way by letting the package search the repository root too.
_src_root = _Path(__file__).resolve().parent.parent
if not (_Path(__file__).resolve().parent / "kernels").is_dir() and (_src_root / "kernels").is_dir():
    __path__.append(str(_src_root))  # type: ignore[name-defined]  # noqa: F821

from dynlab.config import RunSpec  # noqa: E402
from dynlab.groups import Group, get_group  # noqa: E402
from dynlab.models import Tracker, register_cell  # noqa: E402
from dynlab.runner import analyze_study, open_study, run_study  # noqa: E402
from dynlab.study import Study, StudyOptions  # noqa: E402

__all__ = [
    "__version__",
    "Group",
    "RunSpec",
    "Study",
    "StudyOptions",
    "Tracker",
    "analyze_study",
    "get_group",
    "open_study",
    "register_cell",
    "run_study",
]
