"""The public API is explicit and pinned; the rooms' dependencies point down only."""

import ast
from pathlib import Path

import pytest

import dynlab
import dynlab.tracking.models
import dynlab.results
import dynlab.tracking.train

from helpers.paths import REPO as ROOT


def test_public_api_is_pinned():
    assert sorted(dynlab.__all__) == sorted(
        ["__version__", "Group", "RunSpec", "Stacking", "Study", "StudyOptions", "Tracker", "analyze_study", "get_group", "open_study", "register_cell", "run_study"]
    )
    for name in dynlab.__all__:
        assert hasattr(dynlab, name), name
    assert "Tracker" in dynlab.tracking.models.__all__ and "RunStore" in dynlab.results.__all__


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    mods = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            mods.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            mods.add(node.module)
    return mods


def test_kernels_import_torch_only_never_dynlab():
    for path in (ROOT / "kernels").rglob("*.py"):
        assert not any(m.startswith("dynlab") for m in _imports(path)), path


def test_library_never_imports_studies_or_cli():
    """The library never imports the studies nor the command line; the application layer
    (dynlab/app/, what the commands do) sits above the studies and below the command line."""
    for path in (ROOT / "dynlab").rglob("*.py"):
        if path.is_symlink():  # dynlab/cli.py: cli.py itself, the command line
            continue
        above = ("dynlab.cli",) if (ROOT / "dynlab" / "app") in path.parents else ("dynlab.studies", "dynlab.cli")
        bad = [m for m in _imports(path) if m.startswith(above)]
        assert not bad, (path, bad)


def test_figures_import_no_torch():
    for path in (ROOT / "dynlab" / "figures").rglob("*.py"):
        assert not any(m == "torch" or m.startswith("torch.") for m in _imports(path)), path


@pytest.mark.slow
def test_importing_dynlab_figures_does_not_load_torch(tmp_path):
    import subprocess
    import sys

    code = "import sys, dynlab.figures, dynlab.tracking.groups; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert res.stdout.strip() == "False"
