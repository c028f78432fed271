"""The sub-packages of dynlab import their public names on first use (module ``__getattr__``,
as ``dynlab/__init__.py`` does), so that importing one module (a mixer, the LM, the tracker's
cells) does not load the whole package and the heavy libraries behind it (scipy.stats,
xarray, pandas, scikit-learn, matplotlib)."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO as ROOT

#: Libraries that the model modules never need at import time.
HEAVY = ("scipy.stats", "xarray", "pandas", "sklearn", "matplotlib", "netCDF4")

#: The model modules: the LM's mixers and model, the tracker's model zoo (cells, registry, tracker).
MODEL_MODULES = ("dynlab.lm.models.mixers", "dynlab.lm.models.model", "dynlab.tracking.models.cells",
                 "dynlab.tracking.models.registry", "dynlab.tracking.models.tracker")

#: Sub-packages whose ``__init__`` is more than a list of names: dynlab.results (its own
#: rules), dynlab.figures (its ``__init__`` is write_figures itself, and every figures
#: module needs matplotlib and xarray anyway).
NOT_LAZY = ("dynlab.results", "dynlab.figures")


def _subpackages(root: Path = ROOT) -> dict[str, Path]:
    """Every sub-package of ``dynlab`` (dotted name -> its ``__init__.py``) but :data:`NOT_LAZY`."""
    out = {}
    for init in sorted((root / "dynlab").rglob("__init__.py")):
        name = ".".join(["dynlab", *init.parent.relative_to(root / "dynlab").parts])
        if name != "dynlab" and not any(name == n or name.startswith(n + ".") for n in NOT_LAZY):
            out[name] = init
    return out


def _is_type_checking(node: ast.stmt) -> bool:
    return isinstance(node, ast.If) and isinstance(node.test, ast.Name) and node.test.id == "TYPE_CHECKING"


def _eager_imports(path: Path) -> list[str]:
    """The modules ``path`` imports when it runs (its top-level statements, ``if TYPE_CHECKING:``
    left out) beyond the standard library, dynlab.errors and dynlab._lazy (standard library only)."""
    out = []
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            names = [node.module or "."] if node.level == 0 else ["." * node.level + (node.module or "")]
        else:
            continue
        out += [n for n in names if n.split(".")[0] not in sys.stdlib_module_names
                and n not in ("dynlab.errors", "dynlab._lazy")]
    return out


def _type_checking_names(path: Path) -> dict[str, str]:
    """name -> module, for every ``from module import name`` under ``if TYPE_CHECKING:``."""
    out = {}
    for node in ast.parse(path.read_text(encoding="utf-8"), filename=str(path)).body:
        if _is_type_checking(node):
            for sub in node.body:
                if isinstance(sub, ast.ImportFrom):
                    out.update({a.asname or a.name: sub.module for a in sub.names})
    return out


@pytest.mark.parametrize("name", sorted(_subpackages()))
def test_a_subpackage_imports_nothing_until_a_name_is_read(name):
    path = _subpackages()[name]
    assert not _eager_imports(path), (f"{path.relative_to(ROOT)} imports {_eager_imports(path)} when it loads; "
                                      "list the names in _EXPORTS (read on first use) and import them under "
                                      "`if TYPE_CHECKING:`")


@pytest.mark.parametrize("name", sorted(n for n, p in _subpackages().items() if "_EXPORTS" in p.read_text()))
def test_every_public_name_is_read_from_where_it_is_declared(name):
    """``_EXPORTS`` and the ``TYPE_CHECKING`` imports (what type checkers and the import graph
    read) name the same modules; every name imports, is in ``__all__`` and ``dir()``."""
    package = importlib.import_module(name)
    assert _type_checking_names(_subpackages()[name]) == package._EXPORTS
    assert set(package._EXPORTS) <= set(package.__all__) and dir(package) == sorted(package.__all__)
    for public in package.__all__:
        assert getattr(package, public) is not None, public
    with pytest.raises(AttributeError, match="no attribute 'no_such_name'"):
        package.no_such_name  # noqa: B018


def test_the_eager_import_check_can_fail(tmp_path):
    (tmp_path / "dynlab" / "pkg").mkdir(parents=True)
    (tmp_path / "dynlab" / "__init__.py").write_text("import numpy\n")  # the top level: not a sub-package
    init = tmp_path / "dynlab" / "pkg" / "__init__.py"
    init.write_text("from __future__ import annotations\nimport json\nfrom typing import TYPE_CHECKING\n"
                    "from dynlab.errors import E\nfrom dynlab.pkg.heavy import f\nfrom .other import g\n"
                    "if TYPE_CHECKING:\n    from dynlab.pkg.light import h\n"
                    "def later():\n    import xarray\n")
    assert list(_subpackages(tmp_path)) == ["dynlab.pkg"]
    assert _eager_imports(init) == ["dynlab.pkg.heavy", ".other"]
    assert _type_checking_names(init) == {"h": "dynlab.pkg.light"}


#: Imports the modules named in argv in a fresh interpreter and prints which of :data:`HEAVY` it loaded.
_LOADED = "import importlib, json, sys\n" \
          "for m in sys.argv[2:]:\n    importlib.import_module(m)\n" \
          "print(json.dumps(sorted(h for h in json.loads(sys.argv[1]) if h in sys.modules)))"


@pytest.mark.slow
def test_the_model_modules_load_no_heavy_library(tmp_path):
    res = subprocess.run([sys.executable, "-c", _LOADED, json.dumps(HEAVY), *MODEL_MODULES],
                         capture_output=True, text=True, cwd=tmp_path, timeout=600)
    assert res.returncode == 0, res.stderr[-3000:]
    assert json.loads(res.stdout) == [], f"importing {', '.join(MODEL_MODULES)} loads {res.stdout.strip()}"
