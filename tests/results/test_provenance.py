"""Provenance of the execution path: recorded with every run, in the manifest and in the
dataset attrs; a C kernel that cannot be built warns once with the compiler's message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import torch
import xarray as xr

from dynlab.tracking.spec import ModelSpec, RunSpec, TaskSpec
from dynlab.results import RunStore
from dynlab.results.provenance import provenance, recording
from dynlab.runner.driver import open_study, run_study
from dynlab.runner.protocol import RunOutcome, RunResult, Study, StudyOptions


def _tiny_study() -> Study:
    """Two runs whose training is one selective scan on the CPU (a recorded backend)."""

    def run_one(spec, device, progress):
        from dynlab.kernels.dispatch import selective_scan

        u = torch.zeros(1, 3, 2)
        selective_scan(u, u + 0.1, -torch.ones(2, 2), torch.zeros(1, 3, 2), torch.zeros(1, 3, 2))
        return RunOutcome(RunResult(status="ok", train_steps=1), {"w": torch.zeros(3)})

    def assemble(specs, store, options):
        return xr.Dataset({"seed": ("run", np.array([s.seed for s in specs]))})

    specs = [RunSpec(task=TaskSpec(group="C2"), model=ModelSpec(arch="tanh-rnn", hidden=4), seed=s) for s in range(2)]
    return Study(name="tiny", presets=("smoke",), make_specs=lambda options: specs,
                 run_one=run_one, assemble=assemble, spec_type=RunSpec)


def test_provenance_names_the_versions_the_cpu_and_the_switches(monkeypatch):
    monkeypatch.setenv("DYNLAB_SOME_SWITCH", "on")
    p = provenance()
    assert p["torch"] == torch.__version__ and p["python"] and p["numpy"]
    assert isinstance(p["cpu_model"], str) and p["cpu_model"]
    assert isinstance(p["cpu_flags"], list) and all(isinstance(f, str) for f in p["cpu_flags"])
    assert p["env"]["DYNLAB_SOME_SWITCH"] == "on"
    assert set(p) >= {"c_kernels", "c_compiler", "scan_backends", "torch_cpu_capability", "cuda_devices"}
    json.dumps(p)  # JSON-able


def test_a_recording_holds_the_kernels_and_backends_of_its_block(monkeypatch):
    from dynlab.kernels import fast_tanh
    from dynlab.kernels.dispatch import choose_backend

    with recording() as rec:
        choose_backend("ssd", "cpu")
        fast_tanh._lib()
    inside = provenance(rec)
    assert inside["scan_backends"] == {"ssd": ["torch"]}
    assert inside["c_kernels"]["fast_tanh"] == "compiled" or inside["c_kernels"]["fast_tanh"].startswith("unavailable")
    with recording() as empty:
        pass
    assert provenance(empty)["scan_backends"] == {} and provenance(empty)["c_kernels"] == {}
    monkeypatch.setenv("DYNLAB_C_KERNELS", "0")
    with recording() as off:
        fast_tanh._lib()
    made = provenance(off)
    assert made["c_kernels"] == {"fast_tanh": "disabled"} and made["env"]["DYNLAB_C_KERNELS"] == "0"


def test_every_run_the_manifest_and_the_dataset_record_the_execution_path(tmp_path, monkeypatch):
    monkeypatch.setenv("DYNLAB_MARK", "x")
    study = _tiny_study()
    path = run_study(study, StudyOptions(preset="smoke"), out=tmp_path, device="cpu")
    store = RunStore(tmp_path / "tiny")
    specs = study.make_specs(StudyOptions(preset="smoke"))
    for spec in specs:
        raw = json.loads((store.path(spec) / "result.json").read_text())
        made = raw["provenance"]
        assert made["scan_backends"] == {"selective_scan": ["torch"]} and made["env"]["DYNLAB_MARK"] == "x"
        assert made["device"] == "cpu"
        assert "provenance" not in store.load_result(spec) and store.load_provenance(spec) == made
        assert study.load_result(store, spec).status == "ok"  # the typed result still loads
    manifest = json.loads((tmp_path / "tiny" / "manifest.json").read_text())
    assert manifest["provenance"]["written_by"]["torch"] == torch.__version__
    assert [g["run_ids"] for g in manifest["provenance"]["runs"]] == [[s.spec_hash() for s in specs]]
    assert json.loads(open_study(path).attrs["provenance_json"]) == manifest["provenance"]


def test_datasets_written_outside_a_study_record_the_writer(tmp_path):
    from dynlab.results import write_dataset

    ds = xr.Dataset({"a": ("x", [1.0])})
    write_dataset(ds, tmp_path / "d.nc")
    assert "provenance_json" not in ds.attrs  # the caller's dataset is not changed
    with xr.open_dataset(tmp_path / "d.nc", engine="netcdf4") as back:
        assert json.loads(back.attrs["provenance_json"])["torch"] == torch.__version__


def test_a_broken_compiler_warns_once_with_its_message(tmp_path):
    """CC=false: the build fails; one CKernelWarning for the whole process, naming the
    compiler's failure, and the torch loops run (the library is None)."""
    code = textwrap.dedent("""
        import warnings
        from dynlab.kernels.compiled import CKernelWarning, c_kernels_used, c_library
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            first = c_library("reliab_a", "int f(void) { return 1; }")
            second = c_library("reliab_b", "int g(void) { return 2; }")
            again = c_library("reliab_a", "int f(void) { return 1; }")
        ours = [w for w in caught if issubclass(w.category, CKernelWarning)]
        assert first is None and second is None and again is None
        assert len(ours) == 1, [str(w.message) for w in caught]
        print(ours[0].message)
        print(c_kernels_used()["reliab_b"])
    """)
    env = {**os.environ, "CC": "false", "XDG_CACHE_HOME": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}
    env.pop("DYNLAB_C_KERNELS", None)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]
    message, status = res.stdout.strip().splitlines()
    assert "'reliab_a' could not be built" in message and "false failed (exit 1)" in message
    assert status.startswith("unavailable: CompileError: false failed (exit 1)")


def test_switched_off_kernels_do_not_warn(tmp_path):
    code = textwrap.dedent("""
        import warnings
        warnings.simplefilter("error")
        from dynlab.kernels.compiled import c_library
        assert c_library("reliab_c", "int h(void) { return 3; }") is None
    """)
    env = {**os.environ, "CC": "false", "DYNLAB_C_KERNELS": "0", "XDG_CACHE_HOME": str(tmp_path)}
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-3000:]


def test_recordings_nest_and_end_by_identity():
    from dynlab.kernels.dispatch import choose_backend

    with recording() as outer:
        with recording() as inner:  # both empty (equal) when the inner one ends
            pass
        choose_backend("gla", "cpu")
    assert provenance(outer)["scan_backends"] == {"gla": ["torch"]} and provenance(inner)["scan_backends"] == {}
