"""What CI runs: every test (the slow ones too), and none of the optional references skipped."""

from __future__ import annotations

import re
import shlex
import sys

import pytest

from helpers.optional import REQUIRE_TRANSFORMERS_ENV, need_transformers

from helpers.paths import REPO as ROOT


def test_without_transformers_its_tests_skip_but_fail_when_ci_requires_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "transformers", None)  # `import transformers` raises ImportError
    monkeypatch.delenv(REQUIRE_TRANSFORMERS_ENV, raising=False)
    with pytest.raises(pytest.skip.Exception):
        need_transformers()
    monkeypatch.setenv(REQUIRE_TRANSFORMERS_ENV, "1")
    with pytest.raises(pytest.fail.Exception, match=f"{REQUIRE_TRANSFORMERS_ENV}=1 requires it"):
        need_transformers()


def _ci_lines() -> list[str]:
    return [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()
            if line.strip() and not line.strip().startswith("#")]


def test_ci_requires_the_optional_references_and_runs_the_slow_tests():
    lines = _ci_lines()
    exported = {w.split("=")[0] for line in lines if line.startswith("export ") for w in shlex.split(line)[1:]}
    assert {"DYNLAB_REQUIRE_MAMBA_REF", REQUIRE_TRANSFORMERS_ENV} <= exported
    pytest_runs = [shlex.split(line) for line in lines if "pytest" in shlex.split(line)[:3]]
    assert pytest_runs and all(_has(run[run.index("pytest"):], ["-m", ""]) for run in pytest_runs), pytest_runs
    # the entry point: `python -m pytest` puts the checkout's dynlab/ folder before the installed package
    assert all(run[0] == "pytest" for run in pytest_runs), pytest_runs


def test_the_readme_runs_the_tests_with_the_pytest_command():
    """A regular install (README) is shadowed by the checkout's dynlab/ folder under
    `python -m pytest`; README's test command is the `pytest` entry point."""
    readme = (ROOT / "README.md").read_text()
    assert "python -m pytest" not in readme and '".[test]" && pytest' in readme


def test_the_default_run_leaves_out_the_slow_tests():
    """README's test command (plain `pytest`) deselects @pytest.mark.slow through
    addopts; `-m ""` (CI) selects everything again."""
    addopts = re.search(r"^addopts\s*=\s*'(.*)'$", (ROOT / "pyproject.toml").read_text(), re.M)
    assert addopts is not None and _has(shlex.split(addopts.group(1)), ["-m", "not slow"])


def _has(words: list[str], pair: list[str]) -> bool:
    return any(words[i:i + 2] == pair for i in range(len(words)))
