"""dynlab.names is the one list of every name; the registries that map names to code agree with it."""

from __future__ import annotations

import subprocess
import sys
from typing import get_args

from dynlab import names


def test_the_cell_registry_registers_the_built_in_cells_in_order():
    from dynlab.tracking.models import BUILTIN_ARCHS, get_cell
    from dynlab.tracking.models import cells

    assert BUILTIN_ARCHS == names.CELL_NAMES == tuple(c.name for c in names.CELLS)
    for entry in names.CELLS:
        cls = get_cell(entry.name)
        assert cls is getattr(cells, entry.cls) and cls.family == entry.family
        assert entry.theory in names.THEORY_KINDS


def test_mixers_interventions_sources_and_executors_match_their_registries():
    from dynlab.lm.train.interventions import INTERVENTIONS
    from dynlab.lm.models.mixers import MIXERS
    from dynlab.lm.spec import InterventionName, MixerName, TaskInterventionName

    assert tuple(MIXERS) == names.MIXER_NAMES == get_args(MixerName)
    assert tuple(INTERVENTIONS) == names.INTERVENTION_NAMES == get_args(InterventionName)
    assert names.TASK_INTERVENTION_NAMES == get_args(TaskInterventionName)
    assert names.TBTT not in names.TASK_INTERVENTION_NAMES and set(names.TASK_INTERVENTION_NAMES) < set(INTERVENTIONS)


def test_the_theory_table_and_the_benchmark_read_the_entries():
    from dynlab.bench import DENSE
    from dynlab.figures.style import arch_color
    from dynlab.report import THEORY, theory_learns

    assert THEORY == {c.name: c.theory for c in names.CELLS}
    assert theory_learns("negative-mamba", "C2") and not theory_learns("negative-mamba", "C6")
    assert theory_learns("mamba3", "C6") and not theory_learns("mamba3", "S3") and theory_learns("tanh-rnn", "S3")
    assert set(DENSE) == {"linear-rnn", "token-gated-rnn", "tanh-rnn", "state-gated-rnn"}
    assert {arch_color(c.name) for c in names.CELLS} == {c.color for c in names.CELLS}


def test_the_names_load_nothing_heavy(tmp_path):
    code = "import sys, dynlab.names; print(sorted(m for m in ('torch', 'matplotlib', 'numpy', 'pydantic') if m in sys.modules))"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert res.stdout.strip() == "[]"


def test_the_report_and_the_provenance_reader_load_no_torch(tmp_path):
    """``dynlab report`` reads datasets without torch: the one provenance reader lives in the
    torch-free dynlab.results.provenance, whose package imports the run store on use only."""
    code = "import sys, dynlab.report, dynlab.results.provenance; print('torch' in sys.modules)"
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert res.stdout.strip() == "False"


# --- one home per name list: the code, the command line's help and the docs read dynlab.names

import ast
import re
from pathlib import Path

from helpers.paths import REPO as ROOT
#: The lists a copy of which is looked for (names.SOURCES and EXECUTORS are too short to tell).
LISTS = {"BABI_KINDS": names.BABI_KINDS, "NONLINEARITIES": names.NONLINEARITIES,
         "ABLATION_NONLINEARITIES": names.ABLATION_NONLINEARITIES, "INTERVENTION_NAMES": names.INTERVENTION_NAMES,
         "TASK_INTERVENTION_NAMES": names.TASK_INTERVENTION_NAMES, "MIXER_NAMES": names.MIXER_NAMES,
         "CELL_NAMES": names.CELL_NAMES, "HF_EXPORT_FILES": names.HF_EXPORT_FILES}
_SEP = r"(?:,? or |,? and |, | \| |/)"


def _runs(text: str, items: tuple[str, ...]) -> list[tuple[str, ...]]:
    """Every run of two or more of ``items`` in ``text`` joined by commas, ``|``, "or", "and"."""
    text = " ".join(text.split())
    one = "|".join(re.escape(i) for i in sorted(items, key=len, reverse=True))
    word = rf"(?<![\w.*-])(?:{one})(?![\w*-])"
    return [tuple(re.findall(word, m.group(0))) for m in re.finditer(rf"{word}(?:{_SEP}{word})+", text)]


def _copies(text: str) -> list[str]:
    """The lists ``text`` spells out, near whole (all items but one, at least 3, none twice:
    not a table's row), other than exactly as one of :data:`LISTS`."""
    whole = set(LISTS.values())
    return [f"{name}: {', '.join(run)}" for name, items in LISTS.items() for run in _runs(text, items)
            if len(set(run)) == len(run) >= max(3, len(items) - 1) and run not in whole]


def _strings(path: Path, docstrings: bool = True) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), str(path))
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and (docstrings or id(n) not in docs)]


def _tuples(path: Path) -> list[tuple[int, tuple[str, ...]]]:
    out = []
    for n in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(n, (ast.Tuple, ast.List, ast.Set)) and n.elts and all(
                isinstance(e, ast.Constant) and isinstance(e.value, str) for e in n.elts):
            out.append((n.lineno, tuple(e.value for e in n.elts)))
    return out


def _code_files() -> list[Path]:
    files = [ROOT / "cli.py", *[p for d in ("dynlab", "kernels", "studies") for p in sorted((ROOT / d).rglob("*.py"))]]
    return [p for p in files if not p.is_symlink() and p != ROOT / "dynlab" / "names.py"]


def _copied_in_code(files: list[Path]) -> list[str]:
    bad = []
    for path in files:
        where = path.relative_to(path.parents[1]) if path.parent.name != path.parents[1].name else path.name
        bad += [f"{where}:{line} copies {name}" for line, value in _tuples(path)
                for name, items in LISTS.items() if set(value) == set(items)]
        bad += [f"{where}:{line} spells out {c}" for line, text in _strings(path) for c in _copies(text)]
        bad += [f"{where}:{line} spells out {name}" for line, text in _strings(path, docstrings=False)
                for name, items in LISTS.items() for run in _runs(text, items) if run == items and len(items) >= 3]
    return bad


def test_the_code_and_the_command_line_read_the_lists_from_names():
    """No module but dynlab.names writes out a list of names (a tuple of all of them, or a
    help text or message that spells them out; a docstring may name a list whole, as the
    docs do): they import it (tests/app/test_cli_lazy.py and
    the registry tests above check that the registries agree)."""
    assert not (bad := _copied_in_code(_code_files())), bad


def test_the_list_check_can_fail(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "a.py").write_text('KINDS = ("qa1", "qa2", "qa3", "qa6", "qa7")\n'
                              'HELP = "one of zero, random-noise, fitted-noise, state-passing or tbtt"\n'
                              'OLD = "qa1, qa2, qa3, qa6"\nSOME = ("qa1", "qa6", "qa7")\n')
    assert _copied_in_code([pkg / "a.py"]) == ["pkg/a.py:1 copies BABI_KINDS", "pkg/a.py:3 spells out BABI_KINDS: qa1, qa2, qa3, qa6",
                                               "pkg/a.py:2 spells out INTERVENTION_NAMES",
                                               "pkg/a.py:2 spells out TASK_INTERVENTION_NAMES"]


def test_the_rules_and_descriptions_are_written_once():
    """The TBTT rule (names.TBTT_ON_TASKS) and each study's description (the catalog) are
    written in one module; the others read them."""
    from dynlab.studies import CATALOG

    files = _code_files()
    assert [p.name for p in files if "needs consecutive chunks" in p.read_text()] == []
    catalog = ROOT / "studies" / "__init__.py"
    for entry in CATALOG.values():  # no piece of 40 characters or more of it written elsewhere
        copies = [f"{p.name}:{line}" for p in files if p != catalog for line, text in _strings(p)
                  if len(text) >= 40 and text in entry.description]
        assert not copies, (entry.name, copies)


def test_the_command_line_help_and_the_docs_name_the_lists_whole():
    """``--kinds`` and ``--intervention`` in the help list the names of dynlab.names; a list
    the docs spell out is one of them, whole and in order."""
    from typer.testing import CliRunner

    from dynlab.cli import app

    def help_text(*argv: str) -> str:  # the help's words, out of rich's boxes
        return " ".join(CliRunner().invoke(app, [*argv, "--help"]).output.replace("│", " ").split())

    assert f"babilong: comma list of {', '.join(names.BABI_KINDS)}." in help_text("study", "babilong")
    assert f"{', '.join(names.INTERVENTION_NAMES[:-1])} or {names.TBTT}." in help_text("lm", "post-train")
    docs = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    assert not (bad := [f"{p.name}: {c}" for p in docs for c in _copies(p.read_text())]), bad
