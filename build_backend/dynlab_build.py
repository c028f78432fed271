"""dynlab's PEP 517 build backend: hatchling, with an editable install that keeps the layout.

The repository keeps ``kernels/``, ``studies/`` and ``cli.py`` beside ``dynlab/``; the wheel
installs them as ``dynlab.kernels``, ``dynlab.studies`` and ``dynlab.cli``
(``[tool.hatch.build.targets.wheel.force-include]`` in pyproject.toml, the one place the
mapping is written).  Regular wheels and sdists are hatchling's own.  hatchling's editable
wheel would put the repository root on ``sys.path`` (so ``kernels``, ``studies`` and ``cli``
import as top-level names) and copy the force-included files (stale after an edit), so
:func:`build_editable` rewrites it: no root on the path, no copies, and a small import
finder, ``_dynlab_tree``, that maps ``dynlab`` and each force-included name to its
source in the checkout.  Nothing in ``dynlab`` edits its own ``__path__``.
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import zipfile
from pathlib import Path
from typing import Any

from hatchling.build import (  # noqa: F401  (re-exported: the PEP 517 hooks hatchling implements)
    build_sdist,
    build_wheel,
    get_requires_for_build_editable,
    get_requires_for_build_sdist,
    get_requires_for_build_wheel,
)
from hatchling.build import build_editable as _hatchling_build_editable

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: hatchling depends on tomli there
    import tomli as tomllib

__all__ = [
    "build_editable",
    "build_sdist",
    "build_wheel",
    "get_requires_for_build_editable",
    "get_requires_for_build_sdist",
    "get_requires_for_build_wheel",
]

#: The editable install's finder module and .pth file ("tree": the checkout's source tree); the
#: name sorts after _dynlab_start.pth, which must run first (dynlab/_start.py).
FINDER = "_dynlab_tree"

_FINDER_SOURCE = '''"""dynlab's editable install: maps dynlab's modules to their sources in the checkout.

Loaded by a .pth file at every start of Python: it imports only what the interpreter has
already loaded (no pathlib), so that dynlab's start-up guard sees the same modules as in a
regular install.
"""
import os
import sys

MAPPING = {mapping!r}


class DynlabEditableFinder:
    @classmethod
    def find_spec(cls, fullname, path=None, target=None):
        source = MAPPING.get(fullname)
        if source is None:
            return None
        from importlib.util import spec_from_file_location

        if os.path.isdir(source):
            return spec_from_file_location(fullname, os.path.join(source, "__init__.py"),
                                           submodule_search_locations=[source])
        return spec_from_file_location(fullname, source)

    @classmethod
    def invalidate_caches(cls):
        pass


def install():
    if DynlabEditableFinder not in sys.meta_path:
        sys.meta_path.append(DynlabEditableFinder)
'''


def source_mapping(root: Path) -> dict[str, str]:
    """Module name -> absolute source path: ``dynlab`` and every force-included module or
    package (a force-included data file, such as a ``.pth``, is no module: the editable
    wheel keeps hatchling's copy of it)."""
    config = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    wheel = config["tool"]["hatch"]["build"]["targets"]["wheel"]
    mapping = {pkg: str(root / pkg) for pkg in wheel["packages"]}
    for source, target in wheel.get("force-include", {}).items():
        if target.endswith(".py") or (root / source).is_dir():
            mapping[target.removesuffix(".py").replace("/", ".")] = str(root / source)
    return mapping


def _record_line(name: str, data: bytes) -> str:
    digest = base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
    return f"{name},sha256={digest},{len(data)}"


def build_editable(
    wheel_directory: str,
    config_settings: dict[str, Any] | None = None,
    metadata_directory: str | None = None,
) -> str:
    """PEP 660: hatchling's editable wheel, with its path entry and copies replaced by the finder."""
    root = Path(os.getcwd())
    mapping = source_mapping(root)
    packages = set(tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
                   ["tool"]["hatch"]["build"]["targets"]["wheel"]["packages"])
    with tempfile.TemporaryDirectory() as tmp:
        name = _hatchling_build_editable(tmp, config_settings, metadata_directory)
        with zipfile.ZipFile(Path(tmp) / name) as src:
            copies = tuple(f"{n.replace('.', '/')}/" for n in mapping if n not in packages) + tuple(
                f"{n.replace('.', '/')}.py" for n in mapping if n not in packages)
            kept = {
                info.filename: src.read(info)
                for info in src.infolist()
                # hatchling's path entry (the repository root on sys.path) and its copies of the mapped sources
                if not (info.filename.startswith("_editable_impl_") and info.filename.endswith(".pth"))
                and not info.filename.startswith(copies)
            }
    record = next(n for n in kept if n.endswith(".dist-info/RECORD"))
    files = {n: d for n, d in kept.items() if n != record}
    files[f"{FINDER}.py"] = _FINDER_SOURCE.format(mapping=mapping).encode()
    files[f"{FINDER}.pth"] = f"import {FINDER}; {FINDER}.install()\n".encode()
    lines = [_record_line(n, d) for n, d in files.items()] + [f"{record},,"]
    files[record] = ("\n".join(lines) + "\n").encode()
    target = Path(wheel_directory) / name
    with zipfile.ZipFile(target, "w", zipfile.ZIP_DEFLATED) as out:
        for n, d in files.items():
            out.writestr(n, d)
    return name
