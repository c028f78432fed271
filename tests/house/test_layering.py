"""The layering of the package: what may import what (read from the source, not at run time)."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from helpers.paths import REPO as ROOT


def _imports(path: Path) -> set[str]:
    """Every module named by an ``import`` or ``from … import`` anywhere in ``path`` (function bodies too)."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


def _files(*parts: str) -> list[Path]:
    out = []
    for part in parts:
        p = ROOT / part
        out += sorted(p.rglob("*.py")) if p.is_dir() else [p]
    return out


@pytest.mark.parametrize("path", _files("dynlab/analysis", "dynlab/tracking/analysis", "dynlab/tracking/evaluate.py",
                                        "dynlab/tracking/models",
                                        "dynlab/runtime.py",
                                        "dynlab/results", "dynlab/figures"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_analysis_evaluation_models_and_runtime_import_nothing_from_training(path):
    bad = sorted(m for m in _imports(path) if m == "dynlab.tracking.train" or m.startswith("dynlab.tracking.train."))
    assert not bad, f"{path.relative_to(ROOT)} imports the training engine: {bad}"


def _paper_imports(path: Path) -> list[str]:
    """The imports of ``path`` from either paper's package (``dynlab.tracking``, ``dynlab.lm``)."""
    return sorted(m for m in _imports(path) if m in ("dynlab.tracking", "dynlab.lm")
                  or m.startswith(("dynlab.tracking.", "dynlab.lm.")))


@pytest.mark.parametrize("path", _files("dynlab/analysis", "dynlab/figures", "dynlab/report/bench.py", "dynlab/report/format.py"),
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_the_shared_analysis_figures_and_tables_import_neither_paper(path):
    """What both papers share imports neither: each paper's panels and tables live in its own
    package (dynlab/report/__init__.py's report() alone picks a paper's tables by the study)."""
    bad = _paper_imports(path)
    assert not bad, f"{path.relative_to(ROOT)} imports a paper's package: {bad} (paper A's analysis: dynlab/tracking/analysis/)"


#: The machinery both papers' studies share: it names neither paper's package nor its fields.
SHARED_BASE = ("dynlab/spec.py", "dynlab/runner", "dynlab/manifest.py", "dynlab/training.py")


#: Paper A's names: the task's group, the studies' group selection (``extra["groups"]``, ``--groups``).
PAPER_A_NAMES = ("group", "groups", "--groups")


def _paper_fields(path: Path) -> list[str]:
    """Reads of paper A's fields in ``path``: ``x.group``/``x.groups`` (a spec's task, the
    group selection), ``getattr(x, "group")``, or one of :data:`PAPER_A_NAMES` as a string
    (a key, an option)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    reads = [f"{path.name}:{n.lineno} .{n.attr}" for n in ast.walk(tree)
             if isinstance(n, ast.Attribute) and n.attr in PAPER_A_NAMES]
    reads += [f"{path.name}:{n.lineno} {n.value!r}" for n in ast.walk(tree)
              if isinstance(n, ast.Constant) and n.value in PAPER_A_NAMES]
    return reads


@pytest.mark.parametrize("path", _files(*SHARED_BASE), ids=lambda p: str(p.relative_to(ROOT)))
def test_the_shared_base_names_neither_paper(path):
    bad = _paper_imports(path) + _paper_fields(path)
    assert not bad, (f"{path.relative_to(ROOT)} knows a paper: {bad}; a paper's own reading goes behind a "
                     "Study hook (prepare_options, check_analyses) or in its options (a StudyExtra)")


def test_the_paper_field_check_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("def f(spec, options):\n    g = getattr(getattr(spec, 'task', None), 'group', None)\n"
                     "    return spec.task.group, options.groups, options.extra['groups'], {'--groups': 1}\n")
    assert sorted(_paper_fields(probe)) == ["probe.py:2 'group'", "probe.py:3 '--groups'", "probe.py:3 'groups'",
                                            "probe.py:3 .group", "probe.py:3 .groups"]


def test_the_paper_import_check_can_fail(tmp_path):
    probe = tmp_path / "probe.py"
    probe.write_text("import dynlab.lm\nfrom dynlab.tracking.models.streams import tracker_states\n"
                     "from dynlab.analysis.geometry import crossing_time\n")
    assert _paper_imports(probe) == ["dynlab.lm", "dynlab.tracking.models.streams"]


def test_the_runtime_module_sits_below_everything():
    bad = sorted(m for m in _imports(ROOT / "dynlab" / "runtime.py") if m.startswith("dynlab.") and m != "dynlab.errors")
    assert not bad, bad


#: The longest function body the codebase allows (docstring and signature included).
MAX_FUNCTION_LINES = 80


def _long_functions(path: Path, limit: int, root: Path = ROOT) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    return [f"{path.relative_to(root)}:{n.lineno} {n.name} ({n.end_lineno - n.lineno + 1} lines)"
            for n in ast.walk(tree) if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))
            and n.end_lineno - n.lineno + 1 > limit]


def test_no_function_is_longer_than_80_lines():
    long = [f for path in _files("dynlab", "kernels", "studies", "cli.py", "benchmarks")
            for f in _long_functions(path, MAX_FUNCTION_LINES)]
    assert not long, "split these functions into named helpers: " + "; ".join(long)


def test_the_long_function_check_can_fail(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    path = tmp_path / "probe.py"
    path.write_text(f"def too_long():\n{body}\n\n\ndef short():\n    return 1\n")
    assert _long_functions(path, MAX_FUNCTION_LINES, tmp_path) == [f"probe.py:1 too_long ({MAX_FUNCTION_LINES + 1} lines)"]


#: Where each importable name of the package lives in the checkout (pyproject.toml's package-dir).
SOURCES = {"dynlab": ROOT / "dynlab", "dynlab.kernels": ROOT / "kernels", "dynlab.studies": ROOT / "studies",
           "dynlab.cli": ROOT / "cli.py"}


def _package_modules(sources: dict[str, Path] = SOURCES) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the installed package."""
    out = {}
    for name, path in sources.items():
        files = [path] if path.is_file() else sorted(path.rglob("*.py"))
        for file in files:
            parts = [] if file == path else list(file.relative_to(path).with_suffix("").parts)
            if parts and parts[-1] == "__init__":
                parts = parts[:-1]
            out[".".join([name, *parts])] = file
    return out


def _resolved_imports(name: str, path: Path, modules: dict[str, Path]) -> list[tuple[str, str, int]]:
    """``(module, imported name or "", line)`` for every import in ``path`` (function bodies
    too), relative imports resolved; ``from m import x`` names module ``m.x`` when that is one."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            out += [(alias.name, "", node.lineno) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")
                base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                out.append((sub, "", node.lineno) if sub in modules else (base, alias.name, node.lineno))
    return out


def _is_private(part: str) -> bool:
    return part.startswith("_") and not part.startswith("__")


def _private_imports(modules: dict[str, Path], root: Path = ROOT) -> list[str]:
    """Imports of another module's private name (``from m import _x``, ``import m._x``,
    ``m._x`` on an imported module).  A package may use its own private submodules
    (``dynlab`` and ``dynlab.cli`` use ``dynlab._start``), and a module the standard library's
    own private C module (``dynlab._start`` imports ``_signal``)."""
    bad = []
    for name, path in modules.items():
        aliases: dict[str, str] = {}
        tree = ast.parse(path.read_text(), filename=str(path))
        for module, attr, line in _resolved_imports(name, path, modules):
            parts = module.split(".")
            where = f"{path.relative_to(root)}:{line}"
            if attr and _is_private(attr) and module != name:
                bad.append(f"{where} {module}.{attr}")
            for i, part in enumerate(parts):
                owner = ".".join(parts[:i])
                if i == 0 and part in sys.stdlib_module_names:  # the interpreter's own C module (_signal):
                    break  # no public name to give it, and its public twin may cost imports (signal: enum)
                if _is_private(part) and not (name == owner or name.startswith(owner + ".")):
                    bad.append(f"{where} {module}")
                    break
        package = name if path.name == "__init__.py" else name.rpartition(".")[0]
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                # ``import a.b`` binds ``a``; ``import a.b as x`` binds ``x`` to ``a.b``
                aliases.update({a.asname or a.name.split(".")[0]: a.name if a.asname else a.name.split(".")[0]
                                for a in node.names})
            elif isinstance(node, ast.ImportFrom):
                base = node.module or ""
                if node.level:
                    parts = package.split(".")
                    base = ".".join(parts[: len(parts) - node.level + 1] + ([node.module] if node.module else []))
                aliases.update({a.asname or a.name: f"{base}.{a.name}" for a in node.names
                                if f"{base}.{a.name}" in modules})
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _is_private(node.attr):
                chain, value = [], node.value
                while isinstance(value, ast.Attribute):
                    chain.insert(0, value.attr)
                    value = value.value
                if isinstance(value, ast.Name) and value.id in aliases:
                    owner = ".".join([aliases[value.id], *chain])
                    if owner in modules and owner != name:
                        bad.append(f"{path.relative_to(root)}:{node.lineno} {owner}.{node.attr}")
    return bad


def test_no_module_imports_another_modules_private_name():
    modules = _package_modules()
    scripts = {f"benchmarks.{p.stem}": p for p in sorted((ROOT / "benchmarks").glob("*.py"))}
    bad = _private_imports({**modules, **scripts}) if not set(scripts) & set(modules) else ["name clash"]
    assert not bad, "give these names a public name in the module that owns them: " + "; ".join(bad)


def test_the_private_import_check_can_fail(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("from pkg import _own\n")
    (pkg / "_own.py").write_text("X = 1\n")
    (pkg / "a.py").write_text("_helper = 1\n")
    (pkg / "b.py").write_text("from pkg.a import _helper\nfrom pkg._own import X\n")
    (pkg / "c.py").write_text("import pkg.a\n\ndef f():\n    return pkg.a._helper\n")
    (pkg / "d.py").write_text("from . import a\n\nY = a._helper\n")
    modules = _package_modules({"pkg": pkg})
    assert sorted(_private_imports(modules, tmp_path)) == [
        "pkg/b.py:1 pkg.a._helper", "pkg/c.py:4 pkg.a._helper", "pkg/d.py:3 pkg.a._helper"]


def _import_cycles(modules: dict[str, Path]) -> list[list[str]]:
    """The strongly connected components of more than one module in the import graph
    (every import counts, those in function bodies too: a cycle deferred is a cycle)."""
    graph = {name: sorted({m for m, _, _ in _resolved_imports(name, path, modules) if m in modules and m != name})
             for name, path in modules.items()}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    cycles = []

    def visit(v: str) -> None:  # Tarjan's algorithm
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph[v]:
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while not component or component[-1] != v:
                component.append(stack.pop())
            if len(component) > 1:
                cycles.append(sorted(component))

    for v in graph:
        if v not in index:
            visit(v)
    return cycles


def test_no_import_cycle_inside_the_package():
    cycles = _import_cycles(_package_modules())
    assert not cycles, "import cycles: " + "; ".join(" <-> ".join(c) for c in cycles)


def test_the_cycle_check_can_fail(tmp_path):
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "a.py").write_text("def f():\n    from pkg.b import g\n")
    (pkg / "b.py").write_text("from pkg import c\n")
    (pkg / "c.py").write_text("from .a import f\n")
    (pkg / "d.py").write_text("from pkg.a import f\n")
    assert _import_cycles(_package_modules({"pkg": pkg})) == [["pkg.a", "pkg.b", "pkg.c"]]


@pytest.mark.parametrize(("paper", "other"), [("dynlab.tracking", "dynlab.lm"), ("dynlab.lm", "dynlab.tracking")])
def test_the_two_papers_never_import_each_other(paper, other):
    modules = _package_modules()
    bad = sorted(f"{name} <- {module}" for name, path in modules.items() if name == paper or name.startswith(paper + ".")
                 for module, _, _ in _resolved_imports(name, path, modules)
                 if module == other or module.startswith(other + "."))
    assert not bad, bad


def test_import_dynlab_dynlab_fails():
    """No copy of the package under itself: nothing adds the repository root to ``dynlab.__path__``."""
    import dynlab

    assert len(dynlab.__path__) == 1, dynlab.__path__
    for name in ("dynlab.dynlab", "dynlab.tests", "dynlab.docs", "dynlab.benchmarks"):
        with pytest.raises(ModuleNotFoundError):
            importlib.import_module(name)


#: What cli.py may import of the package: the start-up guard, the exit codes, the name lists
#: and the study catalog it declares commands from, and the application layer it calls.
CLI_MAY_IMPORT = ("dynlab._start", "dynlab.errors", "dynlab.names", "dynlab.studies", "dynlab.app")


def _cli_imports_beyond_the_app(path: Path) -> list[str]:
    """The package modules ``path`` (the command line) imports besides :data:`CLI_MAY_IMPORT`
    (``dynlab.app`` and its modules; the catalog, not a study module)."""
    return sorted(m for m in _imports(path) if (m == "dynlab" or m.startswith("dynlab."))
                  and not (m in CLI_MAY_IMPORT or m.startswith("dynlab.app.")))


def test_the_command_line_calls_only_the_application_layer():
    bad = _cli_imports_beyond_the_app(ROOT / "cli.py")
    assert not bad, f"cli.py imports {bad}: a command calls its function in dynlab/app/, which imports the library"


def _app_importers(paths: list[Path], root: Path = ROOT) -> list[str]:
    return sorted(f"{p.relative_to(root)}: {m}" for p in paths for m in _imports(p)
                  if m == "dynlab.app" or m.startswith("dynlab.app."))


def test_nothing_below_the_application_layer_imports_it():
    below = [p for p in _files("dynlab", "studies", "kernels")
             if not p.is_symlink() and (ROOT / "dynlab" / "app") not in p.parents]
    bad = _app_importers(below)
    assert not bad, f"the library, the studies and the kernels sit below dynlab.app: {bad}"


def test_the_application_layer_checks_can_fail(tmp_path):
    cli = tmp_path / "cli.py"
    cli.write_text("from dynlab.app import study\nfrom dynlab.app.checks import NOTES\nimport dynlab.errors\n"
                   "from dynlab.runner.driver import run_study\nfrom dynlab.studies.copying import STUDY\nimport typer\n")
    assert _cli_imports_beyond_the_app(cli) == ["dynlab.runner.driver", "dynlab.studies.copying"]
    below = tmp_path / "runner.py"
    below.write_text("def f():\n    from dynlab.app.checks import parse_list\n")
    assert _app_importers([below, cli], tmp_path) == ["cli.py: dynlab.app", "cli.py: dynlab.app.checks",
                                                      "runner.py: dynlab.app.checks"]


#: The longest module of the application layer (one module per concern).
MAX_APP_MODULE_LINES = 400


def test_the_application_layer_has_one_module_per_concern():
    long = {p.name: n for p in _files("dynlab/app") if (n := len(p.read_text().splitlines())) > MAX_APP_MODULE_LINES}
    assert not long, long
    assert not (ROOT / "dynlab" / "options.py").exists()



#: The longest module that needs no reason; a longer one says at the top of its docstring why
#: it stays one module (a paragraph starting with :data:`LONG_MODULE_REASON`).
MAX_MODULE_LINES = 400
LONG_MODULE_REASON = "Long module:"


def _long_modules_without_a_reason(paths: list[Path], root: Path = ROOT) -> list[str]:
    out = []
    for path in paths:
        text = path.read_text()
        if (n := len(text.splitlines())) <= MAX_MODULE_LINES:
            continue
        doc = ast.get_docstring(ast.parse(text, filename=str(path))) or ""
        if not any(line.startswith(LONG_MODULE_REASON) and len(line) > len(LONG_MODULE_REASON) + 10
                   for line in doc.splitlines()):
            out.append(f"{path.relative_to(root)} ({n} lines)")
    return out


def test_a_module_over_400_lines_says_why_at_its_top():
    paths = [p for p in _files("dynlab", "kernels", "studies", "benchmarks") if not p.is_symlink()]
    bad = _long_modules_without_a_reason(paths)
    assert not bad, (f"split these modules by what changes together, or start a paragraph of the module docstring "
                     f"with {LONG_MODULE_REASON!r} and the reason: " + "; ".join(bad))


def test_the_long_module_check_can_fail(tmp_path):
    body = "\n".join(f"x{i} = {i}" for i in range(MAX_MODULE_LINES))
    (tmp_path / "plain.py").write_text(f'"""A module."""\n{body}\n')
    (tmp_path / "bare.py").write_text(f'"""A module.\n\nLong module:\n"""\n{body}\n')
    (tmp_path / "said.py").write_text(f'"""A module.\n\nLong module: its one algorithm reads as one piece.\n"""\n{body}\n')
    (tmp_path / "short.py").write_text('"""A module."""\nx = 1\n')
    paths = sorted(tmp_path.glob("*.py"))
    assert _long_modules_without_a_reason(paths, tmp_path) == [f"bare.py ({MAX_MODULE_LINES + 4} lines)",
                                                               f"plain.py ({MAX_MODULE_LINES + 1} lines)"]

#: At most this many modules may be long (over :data:`MAX_MODULE_LINES`, each with its reason),
#: and none longer than :data:`MAX_LONG_MODULE_LINES`: a long module is an exception, not a habit.
MAX_LONG_MODULES = 6
MAX_LONG_MODULE_LINES = 600


def _length_problems(lengths: dict[str, int]) -> list[str]:
    """What breaks the length budget of ``lengths`` (module -> lines): too many long modules,
    or one over the hard limit."""
    long = sorted((n, name) for name, n in lengths.items() if n > MAX_MODULE_LINES)
    out = [f"{name} has {n} lines (> {MAX_LONG_MODULE_LINES})" for n, name in long if n > MAX_LONG_MODULE_LINES]
    if len(long) > MAX_LONG_MODULES:
        out.append(f"{len(long)} modules over {MAX_MODULE_LINES} lines (at most {MAX_LONG_MODULES}): "
                   + ", ".join(f"{name} ({n})" for n, name in long))
    return out


def test_few_modules_are_long_and_none_is_too_long():
    paths = [p for p in _files("dynlab", "kernels", "studies", "benchmarks") if not p.is_symlink()]
    lengths = {str(p.relative_to(ROOT)): len(p.read_text().splitlines()) for p in paths}
    assert not _length_problems(lengths), ("split these modules by what changes together: "
                                           + "; ".join(_length_problems(lengths)))


def test_the_length_budget_can_fail():
    fine = {f"m{i}.py": MAX_MODULE_LINES + 1 for i in range(MAX_LONG_MODULES)} | {"short.py": 10}
    assert _length_problems(fine) == []
    assert _length_problems({**fine, "big.py": MAX_LONG_MODULE_LINES + 1}) == [
        f"big.py has {MAX_LONG_MODULE_LINES + 1} lines (> {MAX_LONG_MODULE_LINES})",
        f"{MAX_LONG_MODULES + 1} modules over {MAX_MODULE_LINES} lines (at most {MAX_LONG_MODULES}): "
        + ", ".join(f"m{i}.py ({MAX_MODULE_LINES + 1})" for i in range(MAX_LONG_MODULES))
        + f", big.py ({MAX_LONG_MODULE_LINES + 1})"]


def test_the_command_line_only_wires_and_kernels_are_by_op():
    """cli.py stays wiring (at most 300 lines; the checks live in dynlab.app); kernels/
    holds one folder per op and beside them only what every op shares (building C, the
    backend table, the first-order guard of the backward passes) and the float32 tanh."""
    assert len((ROOT / "cli.py").read_text().splitlines()) <= 300
    loose = sorted(p.name for p in (ROOT / "kernels").glob("*.py") if p.name != "__init__.py")
    ops = sorted(p.name for p in (ROOT / "kernels").iterdir() if (p / "__init__.py").is_file())
    assert loose == ["compiled.py", "dispatch.py", "fast_tanh.py", "first_order.py"], loose
    assert ops == ["adamw", "cross_entropy", "gated_norm", "gla", "scan", "selective_scan", "short_conv", "ssd", "tracker_loss"], ops
    assert sorted(p.relative_to(ROOT / "kernels").as_posix() for p in (ROOT / "kernels").rglob("*.c")) == [
        "adamw/adamw.c", "cross_entropy/cross_entropy.c", "fast_tanh.c", "gated_norm/gated_norm.c", "gla/gla.c",
        "selective_scan/selective_scan.c",
        "short_conv/short_conv.c", "ssd/mixer_inner.c", "ssd/ssd_chunk.c", "tracker_loss/diagonal.c"]
