"""Property-based checks of the study folder contract (the ``hypothesis`` package): for
generated manifests, run-folder trees and option strings, ``dynlab analyze`` and ``dynlab
study`` end with exit 0 or 2 and no traceback, touch no path outside the study folder (the
parent folder listed before and after) and change no file dynlab did not write.

No run is trained: the step that would train (``dynlab.runner.driver.RunLoop`` for ``dynlab
study``, ``run_specs`` for ``dynlab analyze``) is replaced by one that stops the command, so
a case that gets that far only shows that the checks before it let it through."""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path

import pytest

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, example, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

import dynlab.runner.driver as runner  # noqa: E402
from dynlab.cli import main  # noqa: E402
from dynlab.results.folder import STUDY_NAMES  # noqa: E402

VICTIM_ID = "0123456789abcdef"
#: The run that group-tracking's smoke preset makes for tanh-rnn on C2 with seed 0.
REAL_ID = "6f20a8bc8e64ed1c"
#: What a study folder may hold besides dynlab's names: each a path and what it holds
#: ("dir", "link-out": a link to a folder outside the study, or file text).
EXTRAS = {
    "thesis.tex": "my thesis",
    "dataset.nc": "not netcdf",
    "runs/notes.txt": "mine",
    f"runs/{VICTIM_ID}/spec.json": '{"no": "fields"}',
    f"runs/{REAL_ID}/spec.json": "{",
    "quarantine/old/WHY.txt": "mine",
    ".hidden": "mine",
    "runs": "link-out",
    f"runs/{REAL_ID}": "link-out",
}
RUN_IDS = st.one_of(
    st.sampled_from([f"../../victim/runs/{VICTIM_ID}", "../victim", "/etc", "..", ".", "", VICTIM_ID, REAL_ID,
                     f"{REAL_ID}/../{VICTIM_ID}", REAL_ID.upper()]),
    st.text(alphabet="0123456789abcdef./", max_size=18),
    st.integers(-2, 2),
)
MANIFESTS = st.one_of(
    st.fixed_dictionaries(
        {"study": st.sampled_from(["group-tracking"] * 4 + ["copying", "nope"]),
         "preset": st.sampled_from(["smoke", "smoke", "huge"]),
         "run_ids": st.lists(RUN_IDS, max_size=4)},
        optional={"models": st.sampled_from([["tanh-rnn"], "tanh-rnn", None, ["x"]]),
                  "groups": st.sampled_from([["C2"], None, [1]]), "seeds": st.sampled_from([[0], [-1], None])}),
    st.sampled_from(["[1]", "{", "", "null"]),
)
#: A manifest whose options make run REAL_ID, listing a path outside the study too.
TRAVERSAL = {"study": "group-tracking", "preset": "smoke", "models": ["tanh-rnn"], "groups": ["C2"], "seeds": [0],
             "run_ids": [REAL_ID, f"../../victim/runs/{VICTIM_ID}"]}
OPTION_TEXT = st.one_of(st.sampled_from(["tanh-rnn", "tanh-rnn,,mamba", "all", ",", "", " ", "mamba,tanh-rnn"]),
                        st.text(alphabet="abcmnrt-, ", max_size=12))


class WouldTrain(Exception):
    """Raised where the command would start training."""


def _snapshot(folder: Path, skip: Path | None = None) -> dict[str, tuple]:
    """Every path under ``folder`` (not under ``skip``) with its kind, bytes and mtime."""
    seen = {}
    for root, dirs, files in os.walk(folder, followlinks=False):
        for name in dirs + files:
            p = Path(root) / name
            if skip is not None and (p == skip or skip in p.parents):
                continue
            st_ = p.lstat()
            data = p.read_bytes() if p.is_file() and not p.is_symlink() else None
            seen[str(p.relative_to(folder))] = (p.is_symlink(), data, st_.st_mtime_ns)
    return seen


def _foreign(study: Path) -> dict[str, tuple]:
    """The files in ``study`` dynlab did not write (not dynlab's names, not under runs/ or
    quarantine/ as dynlab writes them), with their bytes."""
    found = {}
    for rel, value in _snapshot(study).items():
        top = rel.split("/")[0]
        parts = rel.split("/")
        dynlab_run_file = top == "runs" and len(parts) >= 2 and len(parts[1]) == 16
        if top in STUDY_NAMES and (top not in ("runs", "quarantine") or dynlab_run_file or len(parts) == 1):
            continue
        found[rel] = value
    return found


def _make(base: Path, manifest, extras: list[str]) -> Path:
    study = base / "out" / "group-tracking"
    victim = base / "victim" / "runs" / VICTIM_ID
    victim.mkdir(parents=True)
    (victim / "spec.json").write_text('{"mine": 1}')
    (base / "victim" / "runs" / REAL_ID).mkdir()
    study.mkdir(parents=True)
    for rel in extras:
        what, path = EXTRAS[rel], study / rel
        if path.exists() or path.is_symlink() or any(p.is_symlink() or p.is_file() for p in path.parents if study in p.parents):
            continue
        path.parent.mkdir(parents=True, exist_ok=True)
        if what == "link-out":
            path.symlink_to(base / "victim" / rel)
        else:
            path.write_text(what)
    if manifest is not None:
        (study / "manifest.json").write_text(manifest if isinstance(manifest, str) else json.dumps(manifest))
    return study


def _check(base: Path, study: Path, code: int, err: str, outside: dict, foreign: dict) -> None:
    assert code in (0, 2) or "WouldTrain" in err, (code, err)
    assert "Traceback" not in err, err
    if code == 2:
        assert err.strip().splitlines()[-1].startswith("error: "), err
    assert _snapshot(base, skip=study) == outside  # nothing outside the study touched
    now = _foreign(study)
    assert {k: v for k, v in now.items() if k in foreign} == foreign  # no file dynlab did not write changed


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(manifest=st.one_of(st.none(), MANIFESTS), extras=st.lists(st.sampled_from(sorted(EXTRAS)), max_size=3, unique=True))
@example(manifest=TRAVERSAL, extras=[])  # issue 44: such an entry once renamed a folder outside the study
@example(manifest={**TRAVERSAL, "run_ids": [REAL_ID, REAL_ID]}, extras=[f"runs/{REAL_ID}"])
def test_analyze_on_any_folder_is_exit_0_or_2_and_stays_inside(manifest, extras, capsys, monkeypatch):
    monkeypatch.setattr(runner, "run_specs", lambda *a, **k: (_ for _ in ()).throw(WouldTrain()))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        study = _make(base, manifest, extras)
        outside, foreign = _snapshot(base, skip=study), _foreign(study)
        capsys.readouterr()
        code = main(["analyze", str(study), "-q", "--device", "cpu"])
        _check(base, study, code, capsys.readouterr().err, outside, foreign)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture,
                                                                 HealthCheck.too_slow])
@given(manifest=st.one_of(st.none(), MANIFESTS), extras=st.lists(st.sampled_from(sorted(EXTRAS)), max_size=3, unique=True),
       models=OPTION_TEXT, groups=st.one_of(st.none(), st.sampled_from(["C2", "C2,,S3", "c2", "", "Z9"])))
def test_study_on_any_folder_and_options_is_exit_0_or_2_and_stays_inside(manifest, extras, models, groups, capsys,
                                                                          monkeypatch):
    monkeypatch.setattr(runner, "RunLoop", lambda *a, **k: (_ for _ in ()).throw(WouldTrain()))
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        study = _make(base, manifest, extras)
        outside, foreign = _snapshot(base, skip=study), _foreign(study)
        argv = ["study", "group-tracking", "--preset", "smoke", "--models", models, "--seeds", "0", "-q",
                "--device", "cpu", "--no-analysis", "--out", str(base / "out")]
        capsys.readouterr()
        code = main([*argv, *(["--groups", groups] if groups is not None else [])])
        _check(base, study, code, capsys.readouterr().err, outside, foreign)
