"""Where the checkout and the test data are, from any depth under tests/."""

from __future__ import annotations

from pathlib import Path

#: tests/
TESTS = Path(__file__).resolve().parents[1]
#: The checkout's root (the folder of pyproject.toml).
REPO = TESTS.parent
#: tests/data/: fixtures written by dynlab itself (old run folders, legacy results).
DATA = TESTS / "data"

assert (REPO / "pyproject.toml").is_file() and DATA.is_dir(), REPO
