"""The import graph of the package, read from the source with ``ast`` (nothing is imported).

Nodes are the package's parts: each subpackage of ``dynlab`` (``dynlab.analysis``,
``dynlab.lm``, ``dynlab.tracking``, ...; ``kernels/`` and ``studies/`` as
``dynlab.kernels`` and ``dynlab.studies``, as they are installed), ``cli.py`` as
``dynlab.cli``, and the top-level modules of ``dynlab`` (``dynlab.spec``, ``dynlab.manifest``,
...).  An edge A --> B says some module of A imports some module of B; every ``import``
counts, in function bodies and under ``TYPE_CHECKING`` too, as in
``tests/house/test_layering.py``.  Imports inside one part are not drawn.

``python benchmarks/import_graph.py`` writes the graph as a Mermaid diagram into the
"Import graph" section of docs/development.md (between its ``<!-- import-graph -->``
markers); ``--check`` compares instead of writing (exit 1 when the section is stale);
``--print`` prints the diagram; ``--root DIR`` reads another checkout (e.g. one made by
``git worktree add``).  ``tests/house/test_import_graph.py`` checks that the committed
diagram is current.
"""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = Path("docs") / "development.md"
START, END = "<!-- import-graph -->", "<!-- /import-graph -->"

#: Top-level folders of the checkout installed inside the dynlab namespace (pyproject.toml's package-dir).
MAPPED = {"kernels": "dynlab.kernels", "studies": "dynlab.studies"}

#: The modules beneath everything: the package's parts may all import them, and they import
#: nothing of the package but each other.  The diagram leaves out the edges into them.
FOUNDATIONS = ("dynlab.errors", "dynlab.names", "dynlab.runtime", "dynlab._start")

#: The shared base: the study machinery both papers' studies run on.
SHARED_BASE = ("dynlab.spec", "dynlab.runner.protocol", "dynlab.runner.driver", "dynlab.runner.loop", "dynlab.manifest",
               "dynlab.training")


def module_files(root: Path = ROOT) -> dict[str, Path]:
    """Every module of the package in the checkout at ``root``: dotted name -> file
    (``dynlab/cli.py``, a link to ``cli.py``, is read once, as ``cli.py``)."""
    files: dict[str, Path] = {"dynlab.cli": root / "cli.py"}
    for folder, prefix in (("dynlab", "dynlab"), *MAPPED.items()):
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root / folder).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            name = ".".join([prefix, *parts])
            files.setdefault(name, path)
    return files


def imported(name: str, path: Path, is_package: bool) -> set[str]:
    """The modules that module ``name`` (its source ``path``) names in an import anywhere
    (relative imports resolved against ``name``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = name.split(".")
                base = base[: len(base) - node.level + (1 if is_package else 0)]
                module = ".".join(base + ([node.module] if node.module else []))
            else:
                module = node.module or ""
            found.add(module)
            found.update(f"{module}.{alias.name}" for alias in node.names)  # `from pkg import module`
    return found


def part(module: str) -> str:
    """The node of ``module``: its subpackage of dynlab, or the top-level module itself."""
    pieces = module.split(".")
    return ".".join(pieces[:2])


def graph(root: Path = ROOT) -> dict[str, set[str]]:
    """node -> the nodes it imports (itself left out), for the checkout at ``root``."""
    files = module_files(root)
    edges: dict[str, set[str]] = {part(m): set() for m in files}
    for name, path in files.items():
        is_package = path.name == "__init__.py"
        for target in imported(name, path, is_package):
            if target in files and part(target) != part(name):
                edges[part(name)].add(part(target))
    return edges


def module_imports(module: str, root: Path = ROOT) -> set[str]:
    """The package's modules that ``module`` imports (for the layering tests)."""
    files = module_files(root)
    path = files[module]
    return {t for t in imported(module, path, path.name == "__init__.py") if t in files}


def _node_id(node: str) -> str:
    return node.replace(".", "_")


def packages(files: dict[str, Path]) -> set[str]:
    """The nodes that are subpackages (the others are top-level modules of dynlab)."""
    found = {part(m) for m, p in files.items() if p.name == "__init__.py" and m != "dynlab"}
    return found | {part(m) for m in files if m.count(".") >= 2} | {"dynlab.cli"}


def mermaid(edges: dict[str, set[str]], subpackages: set[str]) -> str:
    """The graph as a Mermaid flowchart (top-down), nodes and edges sorted; the top-level
    modules of dynlab in one box, the :data:`FOUNDATIONS` left out (a ValueError when one of
    them imports another part of the package)."""
    for node in FOUNDATIONS:
        above = edges.get(node, set()) - set(FOUNDATIONS)
        if above:
            raise ValueError(f"{node} imports {', '.join(sorted(above))}: it is no longer beneath everything")
    edges = {a: {b for b in targets if b not in FOUNDATIONS} for a, targets in edges.items() if a not in FOUNDATIONS}
    modules = sorted(n for n in edges if n not in subpackages)
    lines = ["```mermaid", "flowchart TD"]
    lines += [f"  {_node_id(n)}[{n}]" for n in sorted(n for n in edges if n in subpackages)]
    lines += ["  subgraph base [top-level modules of dynlab]"]
    lines += [f"    {_node_id(n)}({n})" for n in modules]
    lines += ["  end"]
    lines += [f"  {_node_id(a)} --> {_node_id(b)}" for a in sorted(edges) for b in sorted(edges[a])]
    lines.append("```")
    return "\n".join(lines)


def diagram(root: Path = ROOT) -> str:
    """The Mermaid diagram of the checkout at ``root``."""
    return mermaid(graph(root), packages(module_files(root)))


def with_diagram(text: str, body: str) -> str:
    """``text`` (docs/development.md) with the section between the markers replaced by ``body``."""
    pattern = re.compile(re.escape(START) + r"\n(?:.*?\n)?" + re.escape(END), re.S)
    if len(pattern.findall(text)) != 1:
        raise ValueError(f"{DOC} needs exactly one {START} … {END} section")
    return pattern.sub(lambda _: f"{START}\n{body}\n{END}", text)


def main(argv: list[str]) -> int:
    root = Path(argv[argv.index("--root") + 1]) if "--root" in argv else ROOT
    body = diagram(root)
    if "--print" in argv:
        print(body)
        return 0
    doc = root / DOC
    text = doc.read_text(encoding="utf-8")
    fresh = with_diagram(text, body)
    if "--check" in argv:
        same = fresh == text
        print(f"{DOC}'s import graph is up to date" if same else
              f"{DOC}'s import graph is stale: run python benchmarks/import_graph.py")
        return 0 if same else 1
    doc.write_text(fresh, encoding="utf-8")
    print(f"wrote the import graph of {DOC}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
