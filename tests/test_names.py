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
    from dynlab.lm.interventions import INTERVENTIONS
    from dynlab.lm.mixers import MIXERS
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
