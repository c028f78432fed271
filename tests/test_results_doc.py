"""docs/results.md and README.md's headline tables are what benchmarks/make_results.py writes
from the committed datasets (they cannot drift, and a number edited by hand fails)."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def make_results():
    spec = importlib.util.spec_from_file_location("make_results", ROOT / "benchmarks" / "make_results.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def readme_text() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_results_document_is_generated_from_the_committed_datasets(make_results):
    assert (ROOT / "docs" / "results.md").read_text() == make_results.document(), \
        "docs/results.md is stale: run python benchmarks/make_results.py"


def test_readme_tables_are_generated_from_the_committed_datasets(make_results, readme_text):
    assert set(make_results.README_SECTIONS) == {"paper-a", "paper-b"}
    for name in make_results.README_SECTIONS:
        assert readme_text.count(f"<!-- results:{name} -->") == 1 and readme_text.count(f"<!-- /results:{name} -->") == 1
    assert make_results.stale_sections(readme_text) == [], "README.md is stale: run python benchmarks/make_results.py"
    assert make_results.readme(readme_text) == readme_text


def _section(text: str, name: str) -> str:
    return re.search(rf"<!-- results:{name} -->\n(.*?)\n<!-- /results:{name} -->", text, re.S).group(1)


@pytest.mark.parametrize(("name", "number"), [("paper-a", "+0.93 [+0.85, +0.97]"), ("paper-a", "4/5, 1000"),
                                              ("paper-b", "1.146 ± 0.081"), ("paper-b", "0.56 / 0.29")])
def test_a_hand_edited_number_in_a_readme_table_is_stale(make_results, readme_text, name, number):
    """Each number is one the datasets give (found in the section); changing a digit of it
    makes exactly that section stale."""
    body = _section(readme_text, name)
    assert number in body
    edited_number = re.sub(r"\d(?=\D*$)", lambda m: str((int(m.group()) + 1) % 10), number)
    edited = readme_text.replace(body, body.replace(number, edited_number, 1), 1)
    assert make_results.stale_sections(edited) == [name]
    assert make_results.readme(edited) == readme_text


def test_the_readme_sections_carry_the_datasets_numbers(make_results, readme_text):
    """Numbers read from the datasets independently of the table code (xarray directly)."""
    import numpy as np

    ds = make_results._dataset("group-tracking-sweep")
    rows = (ds["arch"] == "token-gated-rnn") & (ds["group"] == "S3") & (ds["status"] == "ok")
    mp = ds["mp"].values[rows.values]
    cell = f"{mp.size}/5, {np.median(mp):.0f} ({mp.min():.0f}–{mp.max():.0f})"
    assert "| token-gated-rnn | " in _section(readme_text, "paper-a") and cell in _section(readme_text, "paper-a")
    r = float(ds["corr_r"].sel(variant="q_dec", censoring="drop"))
    assert "| `q_dec` (trained decoder; the default) | " in readme_text and f"{r:+.2f} [" in readme_text
    lg = make_results._dataset("length-generalization-no-conv")
    last = lg["t"].values.max()
    far = lg["ppl_binned"].where(lg["t"] > last - last / 8).mean("t") / lg["lg_p_star"]
    zero = far.values[lg["intervention"].values.astype(str) == "zero"]
    assert f"{zero.mean():.3f} ± {zero.std(ddof=1):.3f}" in _section(readme_text, "paper-b")


def test_readme_stays_short_and_names_its_generator(readme_text):
    assert len(readme_text.splitlines()) <= 300
    assert readme_text.count("python benchmarks/make_results.py") >= 2


def test_a_readme_without_the_markers_is_refused(make_results, readme_text):
    with pytest.raises(ValueError, match="results:paper-b"):
        make_results.readme(readme_text.replace("<!-- /results:paper-b -->", ""))
