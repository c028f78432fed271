"""The command line is light: --help, `study list` and every refusal of bad input load
neither torch nor matplotlib, and the static study catalog says what the study modules say."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from dynlab.runner.protocol import Study
from dynlab.studies import CATALOG, CELL_NAMES, MIXER_NAMES, SOURCES, STUDIES, get_study


#: Commands that must end without loading torch or matplotlib: (argv, exit code).
LIGHT = [
    (["--help"], 0),
    ([], 0),
    (["study", "list"], 0),
    (["study"], 0),
    (["study", "group-tracking", "--help"], 0),
    (["study", "babilong", "--help"], 0),
    (["lm", "post-train", "--help"], 0),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--seq-len", "0", "--out", "{tmp}/out"], 2),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--samples", "0", "--out", "{tmp}/out"], 2),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--source", "", "--out", "{tmp}/out"], 2),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--intervention", "nope", "--out", "{tmp}/out"], 2),
    (["lm", "post-train", "--checkpoint", "{tmp}/ckpt", "--out", ""], 2),
    (["data", "prepare", "--help"], 0),
    (["data", "prepare", "{tmp}/missing.txt", "--out", "{tmp}/tokens"], 2),
    (["data", "prepare", "{tmp}", "--val-fraction", "1.5", "--out", "{tmp}/tokens"], 2),
    (["data", "prepare", "{tmp}", "--tokenizer", "{tmp}/no-tokenizer.json", "--out", "{tmp}/tokens"], 2),
    (["study", "length-generalization", "--checkpoint", "{tmp}/missing"], 2),
    (["bench", "train", "--length", "1000000000"], 2),
    (["bench", "train", "--models", "lstm9000"], 2),
    (["study", "babilong", "--kinds", "qa4"], 2),
    (["study", "babilong", "--kinds", ","], 2),
    (["study", "passkey", "--depths", "2"], 2),
    (["study", "copying", "--lengths", "x"], 2),
    (["study", "copying", "--depths", "0.5"], 2),
    (["study", "length-generalization", "--source", ""], 2),
    (["study", "length-generalization", "--models", "mamba9"], 2),
    (["study", "length-generalization", "--interventions", "all,zero"], 2),
    (["study", "group-tracking", "--models", "all,tanh-rnn"], 2),
    (["study", "group-tracking", "--models", "lstm9000"], 2),
    (["study", "group-tracking", "--groups", "Q8"], 2),
    (["study", "group-tracking", "--groups", "C100000"], 2),
    (["study", "group-tracking", "--preset", "huge"], 2),
    (["study", "group-tracking", "--seeds", "x"], 2),
    (["study", "group-tracking", "--seeds", "-1"], 2),
    (["study", "group-tracking", "--device", "tpu"], 2),
    (["study", "group-tracking", "--executor", "ray"], 2),
    (["study", "group-tracking", "--out", ""], 2),
    (["study", "nonlinearity", "--models", ","], 2),
    (["study", "group-tracking", "--bogus"], 2),
    (["figures", "{tmp}/no-study", "--out", ""], 2),
    (["figures", "{tmp}/no-study", "--format", "tiff"], 2),
    (["figures", "{tmp}/no-study", "--width", "wide"], 2),
    (["lm", "post-train", "--checkpoint", "{tmp}/no-checkpoint", "--out", "{tmp}/out"], 2),
    (["analyze", "{tmp}/no-study"], 2),
    (["runs", "--help"], 0),
    (["runs", "{tmp}/no-study"], 2),
    (["lm", "export", "{tmp}/no-run", "{tmp}/hf"], 2),
    (["lm", "export", "{tmp}/no-run", ""], 2),
    (["lm", "export", "{tmp}/no-run", "{tmp}/hf", "--dtype", "int8"], 2),
    (["study", "group-tracking", "--preset", "smoke", "--out", "/proc/version"], 2),
    # groups too large for the analyses: their order is read from the name, no group is built
    (["study", "group-tracking", "--groups", "S7", "--out", "{tmp}/out"], 2),
    (["study", "group-tracking", "--groups", "C512", "--out", "{tmp}/out"], 2),
    (["study", "nonlinearity", "--groups", "S3xS3xS3xS3", "--out", "{tmp}/out"], 2),
    (["study", "group-tracking", "--groups", ",".join(f"C{n}" for n in range(1, 513)), "--out", "{tmp}/out"], 2),
]

#: Runs each argv of a JSON list through dynlab.cli.main in this one process and reports,
#: after each, its exit code and whether torch or matplotlib is loaded by then.
PROBE = r"""
import contextlib, io, json, sys
from dynlab.cli import main
rows = []
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        code = main(argv)
    rows.append([code, "torch" in sys.modules, "matplotlib" in sys.modules])
print(json.dumps(rows))
"""


def test_help_listing_and_refusals_load_neither_torch_nor_matplotlib(tmp_path):
    argvs = [[a.replace("{tmp}", str(tmp_path)) for a in argv] for argv, _ in LIGHT]
    res = subprocess.run([sys.executable, "-c", PROBE, json.dumps(argvs)], capture_output=True, text=True, cwd=tmp_path,
                         check=True)
    rows = json.loads(res.stdout)
    for (argv, code), (got, torch, mpl) in zip(LIGHT, rows):
        assert (got, torch, mpl) == (code, False, False), (argv, got, torch, mpl)
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # nothing was written, not even in the current folder


def test_catalog_says_what_each_study_module_says():
    from dynlab.lm.data.corpus import SOURCES as CORPUS_SOURCES
    from dynlab.names import BABI_KINDS
    from dynlab.tracking.models import BUILTIN_ARCHS
    from dynlab.studies import length_generalization, long_context

    assert CELL_NAMES == BUILTIN_ARCHS and SOURCES == CORPUS_SOURCES
    assert MIXER_NAMES == long_context.MIXER_NAMES == length_generalization.MIXER_NAMES
    task_options = {"copying": ("--lengths",), "passkey": ("--lengths", "--depths"), "babi": ("--lengths", "--kinds")}
    kind_of = {"copying": "copying", "passkey": "passkey", "babilong": "babi"}  # dynlab.lm.data.tasks.TASK_KINDS
    for name, entry in CATALOG.items():
        study = get_study(name)
        assert isinstance(study, Study) and study.name == name == entry.name
        fix = f"update CATALOG[{name!r}] in studies/__init__.py to what {entry.module} says"
        assert entry.presets == study.presets, fix
        assert sys.modules[entry.module].STUDY is study, name
        lm = study.spec_type.__name__ in ("LMRunSpec", "LMTaskRunSpec")
        assert entry.command == ("lm" if lm else "tracking"), name
        if not lm:
            assert entry.models == CELL_NAMES and entry.interventions == entry.task_options == entry.kinds == ()
            continue
        assert entry.models == MIXER_NAMES, name
        if name == "length-generalization":
            assert entry.interventions == length_generalization.INTERVENTION_NAMES
            assert entry.task_options == entry.kinds == ()
            continue
        assert entry.interventions == long_context.TASK_INTERVENTIONS, name
        assert study.options_type is long_context.TaskOptions, name
        assert entry.task_options == task_options[kind_of[name]], name
        assert entry.kinds == (BABI_KINDS if kind_of[name] == "babi" else ()), name


def test_cli_constants_match_the_library():
    from dynlab import executors, names
    from dynlab.app import checks, posttrain
    from dynlab.lm.data.tasks import TASK_KINDS
    from dynlab.studies import length_generalization

    assert checks.EXECUTORS is executors.EXECUTORS is names.EXECUTORS
    assert posttrain.INTERVENTION_NAMES is length_generalization.INTERVENTION_NAMES is names.INTERVENTION_NAMES
    assert tuple(posttrain.POST_TRAIN_TASKS) == TASK_KINDS and set(posttrain.POST_TRAIN_TASKS.values()) <= set(CATALOG)


def test_studies_mapping_reads_the_catalog_and_loads_on_use():
    assert list(STUDIES) == list(CATALOG) and len(STUDIES) == len(CATALOG)
    assert "babilong" in STUDIES and "nope" not in STUDIES and STUDIES.get("nope") is None
    with pytest.raises(KeyError):
        STUDIES["nope"]
    with pytest.raises(ValueError, match="unknown study 'nope'; allowed: group-tracking, length-generalization"):
        get_study("nope")
    assert STUDIES["babilong"] is get_study("babilong")


def test_importing_the_cli_and_the_registry_loads_no_study_module(tmp_path):
    code = ("import sys, dynlab.cli, dynlab.runner.protocol; "
            "print(sorted(m for m in sys.modules if m.startswith('dynlab.studies.') or m in ('torch', 'matplotlib')))")
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, check=True)
    assert res.stdout.strip() == "[]"


def test_a_group_too_large_for_the_analyses_is_refused_without_building_it(tmp_path, capsys, monkeypatch):
    """S7 (order 5040), C512 and S3xS3xS3xS3 are refused from their names: no group is built."""
    import dynlab.tracking.groups
    from dynlab.cli import main

    monkeypatch.setattr(dynlab.tracking.groups, "from_generators", lambda *a, **k: pytest.fail("a group was built"))
    dynlab.tracking.groups.get_group.cache_clear()
    try:
        for groups, order in (("S7", 5040), ("c512", 512), ("S3xS3xS3xS3", 1296), ("C2," * 511 + "C512", 512)):
            assert main(["study", "group-tracking", "--groups", groups, "--out", str(tmp_path / "out")]) == 2
            err = capsys.readouterr().err
            assert err.startswith("error: group ") and f"(order {order}) is too large for the per-run analyses" in err
    finally:
        dynlab.tracking.groups.get_group.cache_clear()
    assert not (tmp_path / "out").exists()


@pytest.mark.slow
def test_help_and_the_study_list_print_on_an_ascii_terminal(tmp_path):
    """A terminal that cannot show '…' or 'φ' gets them as escapes, not a UnicodeEncodeError."""
    import os

    env = {**os.environ, "PYTHONIOENCODING": "ascii"}
    seen = ""
    for argv in (["study", "group-tracking", "--help"], ["study", "nonlinearity", "--help"], ["study", "list"], ["--help"]):
        res = subprocess.run([sys.executable, "-m", "dynlab.cli", *argv], cwd=tmp_path, capture_output=True, env=env)
        assert (res.returncode, res.stderr) == (0, b""), (argv, res.stderr.decode(errors="replace")[-400:])
        seen += res.stdout.decode("utf-8")  # click writes its own lines as UTF-8 on a misconfigured ASCII stream
    assert "\\u2026" in seen  # '…' of the help (rich) written as its escape
