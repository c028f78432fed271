"""docs/results.md is what benchmarks/make_results.py writes from the committed datasets (it cannot drift)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_results_document_is_generated_from_the_committed_datasets():
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "benchmarks" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    assert (ROOT / "docs" / "results.md").read_text() == module.document(), \
        "docs/results.md is stale: run python benchmarks/make_results.py"
