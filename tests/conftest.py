"""Checks before any test, and fixtures every folder may use (the folders' own conftest.py
files hold the fixtures of one area: tests/tracking/, tests/kernels/)."""

from __future__ import annotations

import importlib.util
import os
from pathlib import Path

import pytest
import torch

import dynlab

if importlib.util.find_spec("dynlab.kernels") is None:
    # a non-editable install, and `python -m pytest` from the checkout, whose dynlab/ folder
    # (without kernels/ and studies/) comes first on sys.path: the installed package is shadowed
    pytest.exit(f"dynlab was imported from the source folder {os.path.dirname(dynlab.__file__)}, not the installed "
                "package: run the tests with `pytest` (not `python -m pytest`), or install with `pip install -e .`",
                returncode=4)

if not torch.cuda.is_available():
    # Triton kernels run on the CPU through Triton's interpreter, which triton picks when
    # it is first imported (tests/kernels/test_triton.py); on a GPU they run for real.
    os.environ.setdefault("TRITON_INTERPRET", "1")

import helpers.trackers  # noqa: E402,F401  registers the user cell "test-exact-perm" for every test
from helpers.paths import DATA, REPO  # noqa: E402


@pytest.fixture
def repo_root() -> Path:
    """The checkout's root (README.md, docs/, benchmarks/, pyproject.toml)."""
    return REPO


@pytest.fixture
def data_dir() -> Path:
    """tests/data/: fixtures written by dynlab itself (the regression pins read them)."""
    return DATA
