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


#: The longest function body the codebase allows (docstring and signature included).
MAX_FUNCTION_LINES = 80


def _long_functions(path: Path, limit: int, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(root)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > limit]


def test_no_function_is_longer_than_80_lines():
    long = [f for path in _files("dynlab", "kernels", "studies", "cli.py", "benchmarks")
            for f in _long_functions(path, MAX_FUNCTION_LINES)]
    assert not long, "split these functions into named helpers: " + "; ".join(long)


def test_the_long_function_check_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "probe.py"
    path.write_text(f"def too_long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert _long_functions(path, MAX_FUNCTION_LINES, tmp_path) == [f"probe.py:1 too_long ({MAX_FUNCTION_LINES + 1} lines)"]
