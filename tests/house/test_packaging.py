"""The install: kernels/, studies/ and cli.py import as dynlab.kernels, dynlab.studies and
dynlab.cli, from a regular install (a wheel) and from an editable one (the checkout), the
same modules either way (pyproject.toml's ``[tool.setuptools]``)."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

import tomllib

from helpers.paths import REPO as ROOT
#: Where each name of the package lives in the checkout.
TREES = {"dynlab": ROOT / "dynlab", "dynlab.kernels": ROOT / "kernels", "dynlab.studies": ROOT / "studies"}


def _checkout_modules() -> dict[str, Path]:
    """Dotted module name -> its source file in the checkout, for every module of the package."""
    out = {}
    for name, tree in TREES.items():
        for file in sorted(tree.rglob("*.py")):
            parts = list(file.relative_to(tree).with_suffix("").parts)
            if "__pycache__" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = file
    return out


def _packages_in(tree: Path, name: str) -> set[str]:
    return {".".join([name, *init.parent.relative_to(tree).parts]) for init in tree.rglob("__init__.py")}


def _setuptools() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]


def test_pyproject_lists_every_package_and_maps_the_top_level_folders():
    conf = _setuptools()
    found = set().union(*(_packages_in(tree, name) for name, tree in TREES.items()))
    assert set(conf["packages"]) == found, sorted(found ^ set(conf["packages"]))
    assert conf["package-dir"] == {name: tree.name for name, tree in TREES.items()}
    cli = ROOT / "dynlab" / "cli.py"
    assert cli.is_symlink() and str(cli.readlink()) == "../cli.py" and cli.resolve() == ROOT / "cli.py"


def test_the_package_list_check_can_fail(tmp_path):
    (tmp_path / "sub" / "new").mkdir(parents=True)
    (tmp_path / "sub" / "__init__.py").write_text("")
    (tmp_path / "sub" / "new" / "__init__.py").write_text("")
    assert _packages_in(tmp_path / "sub", "dynlab.kernels") == {"dynlab.kernels", "dynlab.kernels.new"}


#: Imports every module named on stdin (outside the checkout) and prints where each came from.
_IMPORT_ALL = r"""
import importlib, json, os, sys
names = json.loads(sys.stdin.read())
files = {}
for name in names:
    files[name] = os.path.realpath(importlib.import_module(name).__file__)
print(json.dumps(files))
"""


def test_the_installed_package_is_the_checkouts_modules(tmp_path):
    """Every module of the checkout imports from the installed dynlab (a regular install: a
    copy of the same bytes; an editable one: the checkout's file itself), dynlab.cli included."""
    modules = _checkout_modules()
    modules["dynlab.cli"] = ROOT / "cli.py"
    assert {"dynlab.kernels.ssd.chunked", "dynlab.studies.length_generalization", "dynlab.cli"} <= set(modules)
    proc = subprocess.run([sys.executable, "-c", _IMPORT_ALL], input=json.dumps(sorted(modules)), cwd=tmp_path,
                          capture_output=True, text=True, timeout=600, env=_env())
    assert proc.returncode == 0, proc.stderr[-3000:]
    files = {name: Path(path) for name, path in json.loads(proc.stdout).items()}
    differ = [name for name, path in files.items() if path.read_bytes() != modules[name].read_bytes()]
    assert not differ, differ
    editable = files["dynlab"] == (ROOT / "dynlab" / "__init__.py").resolve()
    if editable:  # the checkout's own files: an edit takes effect without reinstalling
        assert all(path == modules[name].resolve() for name, path in files.items())
    else:  # a copy inside site-packages, under dynlab/
        site = files["dynlab"].parent.parent
        assert all(path.is_relative_to(site / "dynlab") and not path.is_symlink() for path in files.values())
        for kernel_c in ("fast_tanh.c", "selective_scan/selective_scan.c", "tracker_loss/diagonal.c"):
            assert (site / "dynlab" / "kernels" / kernel_c).read_bytes() == (ROOT / "kernels" / kernel_c).read_bytes()


def _env() -> dict[str, str]:
    import os

    env = dict(os.environ)
    env.pop("PYTHONPATH", None)
    return env


def _copy_checkout(dest: Path) -> Path:
    """The files a build reads, copied (symlinks kept) without build leftovers."""
    ignore = shutil.ignore_patterns(".git", ".venv", "build", "dist", "*.egg-info", "__pycache__", ".pytest_cache",
                                    "runs", "dynlab-runs")
    shutil.copytree(ROOT, dest, symlinks=True, ignore=ignore)
    return dest


def _build(kind: str, src: Path, out: Path) -> Path:
    """A wheel of ``src`` by setuptools' own PEP 517 hook (``build_wheel`` or ``build_editable``)."""
    out.mkdir()
    code = f"import setuptools.build_meta as b; print(b.{kind}({str(out)!r}))"
    proc = subprocess.run([sys.executable, "-c", code], cwd=src, capture_output=True, text=True, timeout=600)
    if proc.returncode != 0 and "No module named 'setuptools'" in proc.stderr:
        pytest.skip("setuptools is not installed in this environment (pip builds with its own)")
    assert proc.returncode == 0, proc.stderr[-3000:]
    return out / proc.stdout.strip().splitlines()[-1]


@pytest.mark.slow
def test_a_wheel_holds_every_module_inside_dynlab_the_c_sources_and_the_corpus(tmp_path):
    src = _copy_checkout(tmp_path / "src")
    with zipfile.ZipFile(_build("build_wheel", src, tmp_path / "wheel")) as wheel:
        names = set(wheel.namelist())
        cli = wheel.read("dynlab/cli.py")
        assert not any((wheel.getinfo(n).external_attr >> 16) & 0o170000 == 0o120000 for n in names)  # no symlinks
    py = {n for n in names if n.endswith(".py")}
    want = {"/".join([*name.split("."), *path.relative_to(tree).parts]) for name, tree in TREES.items()
            for path in tree.rglob("*.py") if "__pycache__" not in path.parts}
    assert py == want, sorted(py ^ want)
    assert cli == (ROOT / "cli.py").read_bytes()  # a real file, the top-level cli.py's bytes
    assert {"dynlab/kernels/fast_tanh.c", "dynlab/kernels/selective_scan/selective_scan.c",
            "dynlab/kernels/tracker_loss/diagonal.c"} <= names
    assert {"dynlab/lm/data/shakespeare.txt.gz", "dynlab/lm/data/NOTICE.md"} <= names  # the corpus `shakespeare`
    top = {n.split("/")[0] for n in names}
    assert top == {"dynlab", next(n for n in top if n.endswith(".dist-info"))}, top  # no kernels, studies, .pth


@pytest.mark.slow
def test_an_editable_install_maps_the_names_to_the_checkout(tmp_path):
    """The editable wheel puts no folder on sys.path (no top-level kernels, studies); its
    import finder maps dynlab, dynlab.kernels and dynlab.studies to the checkout's folders."""
    src = _copy_checkout(tmp_path / "src")
    with zipfile.ZipFile(_build("build_editable", src, tmp_path / "wheel")) as wheel:
        wheel.extractall(tmp_path / "site")
    finders = list((tmp_path / "site").glob("__editable___*_finder.py"))
    assert len(finders) == 1, sorted(p.name for p in (tmp_path / "site").iterdir())
    code = (f"import sys; sys.path.insert(0, {str(tmp_path / 'site')!r}); import {finders[0].stem} as f; "
            "import json; print(json.dumps(f.MAPPING))")
    mapping = json.loads(subprocess.run([sys.executable, "-I", "-S", "-c", code], capture_output=True, text=True,
                                        check=True, cwd=tmp_path).stdout)
    assert {k: Path(v) for k, v in mapping.items()} == {name: src / tree.name for name, tree in TREES.items()}
    for pth in (tmp_path / "site").glob("*.pth"):  # only the finder's hook: no path line
        assert all(line.startswith("import ") for line in pth.read_text().splitlines() if line.strip()), pth
