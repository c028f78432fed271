"""The layering of the package: what may import what (read from the source, not at run time)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def _imports(path: Path) -> set[str]:
    """Every module named by an ``import`` or ``from … import`` anywhere in ``path`` (function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _files(*parts: str) -> list[Path]:
    out = []
    for part in parts:
        p = ROOT / part
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


@pytest.mark.parametrize("path", _files("dynlab/analysis", "dynlab/evaluate.py", "dynlab/models", "dynlab/runtime.py",
                                        "dynlab/results", "dynlab/figures"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_analysis_evaluation_models_and_runtime_import_nothing_from_training(path):
    bad = sorted(m for m in _imports(path) if m == "dynlab.train" or m.startswith("dynlab.train."))
    assert not bad, f"{path.relative_to(ROOT)} imports the training engine: {bad}"


def test_the_runtime_module_sits_below_everything():
    bad = sorted(m for m in _imports(ROOT / "dynlab" / "runtime.py") if m.startswith("dynlab.") and m != "dynlab.errors")
    assert not bad, bad
