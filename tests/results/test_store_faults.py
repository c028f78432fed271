"""Store and study writer under faults: a full disk, writers killed mid-write, the umask.

- a full disk (``OSError(ENOSPC)`` from the write of any file) is one ``OSError`` naming the
  file; the previous files are unchanged and no temporary file is left;
- a finished study leaves no temporary file of a killed writer in its runs, and never
  removes one of a live writer (another process, another host);
- every file and folder the store and the study writer make has the umask's permissions.
"""

from __future__ import annotations

import errno
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

import dynlab.results.files as files
from dynlab.tracking.spec import ModelSpec, RunSpec, TaskSpec
from dynlab.results import RunStore, write_dataset
from dynlab.results.files import STALE_AFTER_S, temp_name, writer_gone
from dynlab.runner.driver import open_study, run_study
from dynlab.runner.protocol import RunOutcome, RunResult, Study, StudyOptions

from helpers.paths import REPO as ROOT


def _spec(seed: int = 0) -> RunSpec:
    return RunSpec(task=TaskSpec(group="C2"), model=ModelSpec(arch="tanh-rnn", hidden=4), seed=seed)


def _tiny_study(n_runs: int = 2, analyse: bool = True) -> Study:
    """A study whose runs take no training: weights of zeros, an analysis of one variable."""

    def run_one(spec, device, progress):
        return RunOutcome(RunResult(status="ok", train_steps=1), {"w": torch.zeros(3)})

    def analyze_one(spec, store, device, progress, extra):
        return xr.Dataset({"q": ("t", np.arange(4.0))})

    def assemble(specs, store, options):
        return xr.Dataset({"seed": ("run", np.array([s.seed for s in specs]))})

    return Study(
        name="tiny", presets=("smoke",), make_specs=lambda options: [_spec(s) for s in range(n_runs)],
        run_one=run_one, assemble=assemble, analyze_one=analyze_one if analyse else None, spec_type=RunSpec,
    )


def _temporaries(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.name.endswith(".tmp") or p.name.startswith(".tmp-"))


def _fail_writes_under(monkeypatch, root: Path, name_part: str = "") -> None:
    """Make every ``os.write`` to a file under ``root`` (whose name contains ``name_part``)
    fail as on a full disk."""
    write = os.write

    def full_disk(fd, data):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            target = ""
        if target.startswith(str(root)) and name_part in Path(target).name:
            raise OSError(errno.ENOSPC, "No space left on device")
        return write(fd, data)

    monkeypatch.setattr(files.os, "write", full_disk)


needs_proc = pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to tell a file's fd")


# -- a full disk ---------------------------------------------------------------------------
@needs_proc
def test_full_disk_writing_a_dataset_keeps_the_previous_file_and_leaves_no_temp(tmp_path, monkeypatch):
    path = tmp_path / "dataset.nc"
    write_dataset(xr.Dataset({"a": ("x", np.arange(3.0))}), path)
    before = path.read_bytes()
    _fail_writes_under(monkeypatch, tmp_path)
    with pytest.raises(OSError) as info:
        write_dataset(xr.Dataset({"a": ("x", np.arange(1000.0))}), path)
    assert info.value.errno == errno.ENOSPC and str(path) in str(info.value)
    assert path.read_bytes() == before and _temporaries(tmp_path) == []


@needs_proc
@pytest.mark.parametrize("which", ["spec.json", "model.safetensors", "result.json", "checksums.json"])
def test_full_disk_saving_a_run_leaves_no_run_and_no_temp(tmp_path, monkeypatch, which):
    store = RunStore(tmp_path)
    _fail_writes_under(monkeypatch, tmp_path, which)
    with pytest.raises(OSError) as info:
        store.save(_spec(), {"status": "ok"}, {"w": torch.zeros(2)})
    assert info.value.errno == errno.ENOSPC
    assert not store.is_done(_spec()) and list(store.runs.iterdir()) == []


@needs_proc
def test_full_disk_writing_an_analysis_keeps_the_run_intact(tmp_path, monkeypatch):
    store = RunStore(tmp_path)
    spec = _spec()
    store.save(spec, {"status": "ok"}, {"w": torch.zeros(2)})
    store.write_dataset(spec, "analysis.nc", xr.Dataset({"q": ("t", np.arange(3.0))}))
    folder = store.path(spec)
    before = {p.name: p.read_bytes() for p in folder.iterdir()}
    _fail_writes_under(monkeypatch, tmp_path, "analysis.nc")
    with pytest.raises(OSError, match="analysis.nc"):
        store.write_dataset(spec, "analysis.nc", xr.Dataset({"q": ("t", np.arange(500.0))}))
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert store.inspect(spec.spec_hash()) is None and _temporaries(tmp_path) == []


@needs_proc
@pytest.mark.parametrize("which", ["analysis.nc", "dataset.nc", "manifest.json"])
def test_full_disk_during_a_study_is_one_error_and_keeps_the_store(tmp_path, monkeypatch, capfd, which):
    """One ``OSError`` with a one-line message (the command line prints it and exits 1),
    nothing printed by the netCDF library, the store as it was, no temporary file."""
    study = _tiny_study()
    out = tmp_path / "out"
    run_study(study, StudyOptions(preset="smoke"), out=out, device="cpu")
    if which == "analysis.nc":  # a missing analysis is written again
        store = RunStore(out / "tiny")
        (store.path(_spec(0)) / "analysis.nc").unlink()
        assert store.inspect(_spec(0).spec_hash()) is None  # an interrupted write, dropped from checksums.json
    before = {p: p.read_bytes() for p in (out / "tiny").rglob("*") if p.is_file()}
    capfd.readouterr()
    _fail_writes_under(monkeypatch, out, which)
    with pytest.raises(OSError) as info:
        run_study(study, StudyOptions(preset="smoke"), out=out, device="cpu")
    assert info.value.errno == errno.ENOSPC and which in str(info.value) and "\n" not in str(info.value)
    assert capfd.readouterr().err == ""
    after = {p: p.read_bytes() for p in (out / "tiny").rglob("*") if p.is_file()}
    if which == "manifest.json":  # the dataset was written before the manifest failed
        before.pop(out / "tiny" / "dataset.nc")
        after.pop(out / "tiny" / "dataset.nc")
    assert after == before and _temporaries(out) == []


def _can_mount_tmpfs() -> bool:
    return sys.platform.startswith("linux") and hasattr(os, "geteuid") and os.geteuid() == 0 and bool(
        subprocess.run(["which", "mount"], capture_output=True).stdout)


@pytest.mark.slow
@pytest.mark.skipif(not _can_mount_tmpfs(), reason="mounting a tiny tmpfs needs root on Linux")
def test_a_study_on_a_really_full_disk_is_one_line_and_exit_1(tmp_path):
    """A real full file system (a 120 KiB tmpfs as --out): the process does not crash."""
    mnt = tmp_path / "tiny"
    mnt.mkdir()
    if subprocess.run(["mount", "-t", "tmpfs", "-o", "size=120k", "tmpfs", str(mnt)], capture_output=True).returncode:
        pytest.skip("mount refused")
    try:
        env = {**os.environ, "DYNLAB_DEBUG": ""}
        env.pop("DYNLAB_DEBUG")
        res = subprocess.run(
            [sys.executable, "-c", "import sys; from dynlab.cli import main; sys.exit(main(sys.argv[1:]))",
             "study", "group-tracking", "--preset", "smoke", "--models", "tanh-rnn", "--groups", "C2",
             "--out", str(mnt), "-q", "--device", "cpu"],
            capture_output=True, text=True, env=env, timeout=600, cwd=tmp_path,
        )
        assert res.returncode == 1, res.stderr[-2000:]
        assert res.stderr.count("\n") == 1 and "No space left on device" in res.stderr
        assert _temporaries(mnt) == [] and not (mnt / "group-tracking" / "dataset.nc").exists()
        for run in (mnt / "group-tracking" / "runs").iterdir():
            assert RunStore(mnt / "group-tracking").inspect(run.name) is None
    finally:
        subprocess.run(["umount", str(mnt)], capture_output=True)


def test_the_store_and_the_study_writer_share_one_netcdf_writer(tmp_path):
    """An integer variable that now holds NaN padding is written as float by both."""
    write_dataset(xr.Dataset({"n": ("x", np.arange(3))}, coords={"x": np.arange(3)}), tmp_path / "ints.nc")
    padded = xr.open_dataset(tmp_path / "ints.nc", engine="netcdf4").load().reindex(x=np.arange(5))
    assert padded["n"].encoding["dtype"].kind == "i" and np.isnan(padded["n"].values[-1])
    store = RunStore(tmp_path / "s")
    store.save(_spec(), {"status": "ok"}, None)
    store.write_dataset(_spec(), "analysis.nc", padded)
    write_dataset(padded, tmp_path / "padded.nc")
    for back in (store.read_dataset(_spec(), "analysis.nc"), xr.open_dataset(tmp_path / "padded.nc", engine="netcdf4")):
        assert np.isnan(back["n"].values[-1]) and back["n"].values[0] == 0


def test_the_netcdf_writer_keeps_every_kind_of_value_and_writes_netcdf4(tmp_path):
    """What a study stores comes back with its dtype: int64 beyond the int32 range (a
    netCDF-3 file would refuse or narrow it), bools, unicode strings, NaN, and attrs; the
    file is netCDF-4 (an HDF5 file, its signature first), which any netCDF-4 reader opens."""
    ds = xr.Dataset(
        {"big": ("run", np.array([2**40, -3], dtype=np.int64)), "ok": ("run", np.array([True, False])),
         "arch": ("run", np.array(["mamba", "tanh-rnn ρ"])), "q": (("run", "t"), np.array([[0.5, np.nan], [1.0, 2.0]]))},
        coords={"run": ["a", "b"], "t": np.array([1, 2], dtype=np.int64)},
        attrs={"preset": "quick", "horizon": 1000, "tau": 1.0, "lengths": [1, 2, 3]},
    )
    write_dataset(ds, tmp_path / "d.nc")
    assert (tmp_path / "d.nc").read_bytes()[:8] == b"\x89HDF\r\n\x1a\n"
    back = open_study(tmp_path / "d.nc")
    for name in ds.variables:
        assert back[name].dtype == ds[name].dtype, name
        np.testing.assert_array_equal(back[name].values, ds[name].values)
    assert [back.attrs[k] for k in ("preset", "horizon", "tau")] == ["quick", 1000, 1.0]
    assert list(back.attrs["lengths"]) == [1, 2, 3]  # a list attr comes back as an array


# -- leftovers of killed writers -------------------------------------------------------------
def _killed_writer(target: Path) -> Path:
    """Start a process that begins writing ``target`` (its temporary file) and is killed."""
    code = textwrap.dedent(f"""
        import os, signal
        from pathlib import Path
        from dynlab.results.files import temp_name
        tmp = temp_name(Path({str(target)!r}))
        tmp.write_bytes(b"half an analysis")
        print(tmp, flush=True)
        os.kill(os.getpid(), signal.SIGKILL)
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=target.parent)
    assert res.returncode == -signal.SIGKILL
    return Path(res.stdout.strip())


@pytest.mark.slow
def test_a_finished_study_removes_the_temp_files_of_killed_writers(tmp_path):
    study = _tiny_study()
    run_study(study, StudyOptions(preset="smoke"), out=tmp_path, device="cpu")
    store = RunStore(tmp_path / "tiny")
    run = store.path(_spec(0))
    leftovers = [_killed_writer(run / "analysis.nc"), _killed_writer(store.root / "dataset.nc")]
    dead_dir = files.temp_dir_name(store.runs, _spec(1).spec_hash())
    dead_dir.mkdir()
    os.utime(dead_dir, (time.time() - 2 * STALE_AFTER_S,) * 2)  # a killed save, long ago (no writer in its name)
    legacy = run / ".analysis.nc.k3j2h1.tmp"  # written before temp names carried their writer
    legacy.write_bytes(b"old")
    os.utime(legacy, (time.time() - 2 * STALE_AFTER_S,) * 2)
    assert all(p.exists() for p in leftovers) and writer_gone(leftovers[0])
    assert store.inspect(_spec(0).spec_hash()) is None  # hidden temp files are no damage
    run_study(study, StudyOptions(preset="smoke"), out=tmp_path, device="cpu")  # a rerun: everything reused
    assert _temporaries(tmp_path) == []


def test_the_sweep_keeps_the_temp_files_of_live_writers(tmp_path):
    """A concurrent study (another live process, this process, another host) keeps its
    temporary files until they are an hour old."""
    study = _tiny_study()
    run_study(study, StudyOptions(preset="smoke"), out=tmp_path, device="cpu")
    store = RunStore(tmp_path / "tiny")
    run = store.path(_spec(0))
    sleeper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    try:
        live_other = run / f".analysis.nc.aaaa~{files._host()}~{sleeper.pid}.tmp"
        live_self = temp_name(run / "analysis.nc")
        foreign = run / f".analysis.nc.bbbb~not-{socket.gethostname()}~{os.getpid()}.tmp"
        foreign_old = run / f".analysis.nc.cccc~not-{socket.gethostname()}~1.tmp"
        for p in (live_other, live_self, foreign, foreign_old):
            p.write_bytes(b"being written")
        os.utime(foreign_old, (time.time() - 2 * STALE_AFTER_S,) * 2)
        assert not writer_gone(live_other) and not writer_gone(live_self) and not writer_gone(foreign)
        run_study(study, StudyOptions(preset="smoke"), out=tmp_path, device="cpu")
        assert live_other.exists() and live_self.exists() and foreign.exists() and not foreign_old.exists()
    finally:
        sleeper.kill()
        sleeper.wait()
    assert writer_gone(live_other)
    store.sweep([_spec(0).spec_hash()])
    assert not live_other.exists() and live_self.exists()  # this process's own: only by age


def test_a_reused_pid_does_not_keep_a_dead_writers_file(tmp_path):
    """A pid that now belongs to a process started after the file was written is not its writer."""
    p = tmp_path / f".x.nc.dddd~{files._host()}~{os.getppid()}.tmp"
    p.write_bytes(b"")
    os.utime(p, (1.0, 1.0))  # written long before the parent process started
    if not Path("/proc/stat").is_file():
        pytest.skip("process start times need /proc")
    assert writer_gone(p)


# -- permissions follow the umask ------------------------------------------------------------
@pytest.mark.parametrize("umask", [0o022, 0o027, 0o077])
def test_files_and_folders_follow_the_umask(tmp_path, umask):
    old = os.umask(umask)
    try:
        out = tmp_path / "out"
        path = run_study(_tiny_study(), StudyOptions(preset="smoke"), out=out, device="cpu")
        store = RunStore(out / "tiny")
        spec = _spec(0)
        store.write_json(spec, "extra.json", {"a": 1})
        (store.path(spec) / "result.json").write_text("{broken")  # damage: quarantined
        store.heal(spec.spec_hash())
        write_dataset(xr.Dataset({"a": ("x", [1.0])}), out / "new" / "d.nc")
    finally:
        os.umask(old)
    made = [p for p in out.rglob("*")]
    names = {p.name for p in made}
    assert {"dataset.nc", "manifest.json", "model.safetensors", "analysis.nc", "checksums.json", "spec.json",
            "result.json", "WHY.txt", "d.nc", "runs", "quarantine"} <= names
    assert path.exists() and json.loads((out / "tiny" / "manifest.json").read_text())["study"] == "tiny"
    for p in made:
        mode = p.stat().st_mode & 0o777
        want = (0o777 if p.is_dir() else 0o666) & ~umask
        assert mode == want, f"{p.relative_to(out)}: {oct(mode)}, {oct(want)} expected under umask {oct(umask)}"
    assert open_study(path)["seed"].values.tolist() == [0, 1]


def test_a_study_that_fails_before_storing_anything_leaves_no_folders(tmp_path):
    """E.g. out of memory in the first run: no empty ``runs/`` is left behind; a folder
    that existed before is kept."""
    study = _tiny_study()

    def out_of_memory(spec, device, progress):
        raise MemoryError("cannot allocate 100 GB")

    import dataclasses

    failing = dataclasses.replace(study, run_one=out_of_memory)
    with pytest.raises(MemoryError):
        run_study(failing, StudyOptions(preset="smoke"), out=tmp_path / "a" / "b", device="cpu")
    assert list(tmp_path.iterdir()) == []
    (tmp_path / "kept").mkdir()
    with pytest.raises(MemoryError):
        run_study(failing, StudyOptions(preset="smoke"), out=tmp_path / "kept", device="cpu")
    assert list(tmp_path.iterdir()) == [tmp_path / "kept"] and list((tmp_path / "kept").iterdir()) == []
    run_study(study, StudyOptions(preset="smoke"), out=tmp_path / "kept", device="cpu")
    with pytest.raises(MemoryError):  # runs stored before (reused), one more failing: nothing is removed
        run_study(dataclasses.replace(failing, make_specs=lambda o: [*study.make_specs(o), _spec(5)]),
                  StudyOptions(preset="smoke"), out=tmp_path / "kept", device="cpu")
    assert len(list((tmp_path / "kept" / "tiny" / "runs").iterdir())) == 2
