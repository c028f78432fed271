"""The import graph of docs/development.md is what benchmarks/import_graph.py reads from the
source, and the shared base (spec, runner/, manifest, training) reaches
neither paper's package, directly or through what it imports."""

from __future__ import annotations

import import_graph as graph
import pytest

from helpers.paths import REPO


def test_the_committed_import_graph_is_current():
    text = (REPO / graph.DOC).read_text(encoding="utf-8")
    assert graph.with_diagram(text, graph.diagram(REPO)) == text, \
        "docs/development.md's import graph is stale: run python benchmarks/import_graph.py"


def _reached(module: str) -> dict[str, str]:
    """Every module of the package that ``module`` reaches through imports: module -> the
    module that imports it on the way."""
    via: dict[str, str] = {}
    todo = [module]
    while todo:
        here = todo.pop()
        for target in sorted(graph.module_imports(here, REPO)):
            if target not in via and target != module:
                via[target] = here
                todo.append(target)
    return via


@pytest.mark.parametrize("module", graph.SHARED_BASE)
def test_the_shared_base_reaches_neither_paper(module):
    via = _reached(module)
    papers = sorted(m for m in via if m.split(".")[:2] in (["dynlab", "tracking"], ["dynlab", "lm"]))
    chains = []
    for m in papers[:3]:
        chain = [m]
        while chain[-1] != module:
            chain.append(via[chain[-1]])
        chains.append(" <- ".join(chain))
    assert not papers, f"{module} reaches a paper's package: {'; '.join(chains)}"


def test_the_graph_reads_relative_and_function_imports(tmp_path):
    """A checkout of three modules: the graph has the edges their imports make, the import
    in a function body and the relative one included, and none inside one part."""
    for rel, text in {"cli.py": "from dynlab.app import run\n",
                      "dynlab/__init__.py": "", "dynlab/errors.py": "",
                      "dynlab/app/__init__.py": "from .run import run\n",
                      "dynlab/app/run.py": "def run():\n    from ..spec import Spec\n    from dynlab.errors import E\n",
                      "dynlab/spec.py": "import dynlab.errors\n",
                      "kernels/__init__.py": "", "studies/__init__.py": "from dynlab.kernels import x\n"}.items():
        (tmp_path / rel).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / rel).write_text(text)
    assert graph.graph(tmp_path) == {"dynlab.cli": {"dynlab.app"}, "dynlab": set(), "dynlab.errors": set(),
                                     "dynlab.app": {"dynlab.spec", "dynlab.errors"}, "dynlab.spec": {"dynlab.errors"},
                                     "dynlab.kernels": set(), "dynlab.studies": {"dynlab.kernels"}}
    diagram = graph.diagram(tmp_path)
    assert "  dynlab_app --> dynlab_spec" in diagram and "errors" not in diagram  # a foundation: left out
    with pytest.raises(ValueError, match="needs exactly one"):
        graph.with_diagram("no markers here", diagram)
