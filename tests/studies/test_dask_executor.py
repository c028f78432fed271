"""Dask executor: same results as in-process, retries after a killed worker, clean errors."""

from __future__ import annotations

import functools
import json
import os
import signal
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
import xarray as xr

pytest.importorskip("distributed")
import cloudpickle  # noqa: E402  (a dependency of distributed)

from dynlab.tracking.spec import ModelSpec, RunSpec, TaskSpec  # noqa: E402
from dynlab.executors import (  # noqa: E402
    DaskExecutor,
    InProcessExecutor,
    SchedulerUnreachable,
    make_executor,
    parse_scheduler_address,
)
from dynlab.results.store import RunStore  # noqa: E402
from dynlab.runner.driver import open_study, run_study  # noqa: E402
from dynlab.studies.group_tracking import STUDY as GROUP_TRACKING  # noqa: E402
from dynlab.runner.protocol import RunOutcome, RunResult, Study, StudyOptions  # noqa: E402

# Worker processes cannot import this test module by name: ship its functions by value.
cloudpickle.register_pickle_by_value(sys.modules[__name__])

TINY = {
    "model": {"hidden": 8},
    "train": {"steps": 6, "batch_size": 8, "warmup_steps": 1},
    "eval": {"lengths": (5, 12), "n_samples": 8, "batch_size": 8, "chunk": 8},
}


def _result_files(root: Path) -> dict[str, dict]:
    out = {}
    for p in sorted((root / "runs").glob("*/result.json")):
        r = json.loads(p.read_text())
        for k in ("wall_time_s", "train_time", "provenance"):
            r.pop(k, None)
        out[p.parent.name] = r
    return out


def _weights(root: Path) -> dict[str, dict[str, torch.Tensor]]:
    from safetensors.torch import load_file

    return {p.parent.name: load_file(p) for p in sorted((root / "runs").glob("*/model.safetensors"))}


def test_local_cluster_gives_identical_results_to_in_process(tmp_path):
    options = StudyOptions(preset="quick", models=("tanh-rnn", "linear-rnn"), extra={"groups": ("C2",), **TINY})
    run_study(GROUP_TRACKING, options, out=tmp_path / "inproc", device="cpu", analyze=False)
    with DaskExecutor(workers=1, processes=False) as ex:
        # progress=True: the client-side bars must not be shipped to the worker
        run_study(GROUP_TRACKING, options, out=tmp_path / "dask", device="cpu", analyze=False, executor=ex,
                  progress=True)
    a, b = tmp_path / "inproc" / "group-tracking", tmp_path / "dask" / "group-tracking"
    ra, rb = _result_files(a), _result_files(b)
    assert len(ra) == 2 and ra == rb
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and len(wa) == 2
    for rid in wa:
        assert wa[rid].keys() == wb[rid].keys()
        for name in wa[rid]:
            assert torch.equal(wa[rid][name], wb[rid][name]), (rid, name)
    with xr.open_dataset(a / "dataset.nc", engine="netcdf4") as da, xr.open_dataset(b / "dataset.nc") as db:
        np.testing.assert_array_equal(da["accuracy"].values, db["accuracy"].values)


@pytest.mark.slow
def test_process_workers_give_bit_identical_results_to_in_process(tmp_path):
    """Process-based workers (one thread each, OMP_NUM_THREADS=1 set by Dask's nanny) vs an
    in-process run on a 2-thread "machine": same result files, weights and dataset, bit for
    bit.  tanh-rnn and mamba on C6 and S3 each train as an ensemble of 2 (the dense and the
    diagonal fused kernels; the diagonal one's C loops in the worker process); width 64 so
    that the thread count would change the rounding."""
    extra = {
        "model": {"hidden": 64},
        "train": {"steps": 6, "batch_size": 32, "warmup_steps": 1},
        "eval": {"lengths": (5, 30), "n_samples": 32, "batch_size": 32, "chunk": 16},
    }
    options = StudyOptions(preset="quick", models=("tanh-rnn", "mamba"), extra={"groups": ("C6", "S3"), **extra})
    old = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        run_study(GROUP_TRACKING, options, out=tmp_path / "inproc", device="cpu", analyze=False)
    finally:
        torch.set_num_threads(old)
    with DaskExecutor(workers=1, processes=True) as ex:
        run_study(GROUP_TRACKING, options, out=tmp_path / "dask", device="cpu", analyze=False, executor=ex)
    a, b = tmp_path / "inproc" / "group-tracking", tmp_path / "dask" / "group-tracking"
    ra, rb = _result_files(a), _result_files(b)
    assert len(ra) == 4 and ra == rb
    assert sorted(r.get("ensemble_size", 1) for r in ra.values()) == [2, 2, 2, 2]
    wa, wb = _weights(a), _weights(b)
    assert wa.keys() == wb.keys() and len(wa) == 4
    for rid in wa:
        for name in wa[rid]:
            assert torch.equal(wa[rid][name], wb[rid][name]), (rid, name)
    with xr.open_dataset(a / "dataset.nc", engine="netcdf4") as da, xr.open_dataset(b / "dataset.nc") as db:
        for name in ("accuracy", "accuracy_all", "train_loss", "mp"):
            np.testing.assert_array_equal(da[name].values, db[name].values)


# -- a toy study whose run kills its own worker process the first time ---------------------------


def _toy_specs(options: StudyOptions) -> list[RunSpec]:
    return [RunSpec(task=TaskSpec(group="C2"), model=ModelSpec(arch="tanh-rnn", hidden=4), seed=s) for s in range(4)]


def _toy_value(seed: int) -> float:
    return 1.0 / (seed + 3)


class ToyResult(RunResult):
    """The toy study's result: a value computed from the seed and the worker's process id."""

    value: float
    pid: int


def _toy_run_one(spec: RunSpec, device, progress, marker_dir: str) -> RunOutcome:
    marker = Path(marker_dir) / f"started-{spec.seed}"
    if spec.seed == 2 and not marker.exists():
        marker.write_text(str(os.getpid()))
        os.kill(os.getpid(), signal.SIGKILL)  # the worker dies mid-run, nothing returned
    weights = {"w": torch.arange(5, dtype=torch.float64) * _toy_value(spec.seed)}
    return RunOutcome(ToyResult(status="ok", value=_toy_value(spec.seed), pid=os.getpid()), weights)


def _toy_assemble(specs, store: RunStore, options) -> xr.Dataset:
    vals = [store.load_result(s)["value"] for s in specs]
    return xr.Dataset({"value": ("run", np.asarray(vals))}, coords={"run": np.arange(len(specs))})


@pytest.mark.slow
def test_killed_worker_is_retried_without_lost_or_corrupted_results(tmp_path):
    study = Study(
        name="toy-kill",
        presets=("quick",),
        make_specs=_toy_specs,
        run_one=functools.partial(_toy_run_one, marker_dir=str(tmp_path)),
        assemble=_toy_assemble,
        result_type=ToyResult,
    )
    with DaskExecutor(workers=1, processes=True, retries=1) as ex:
        path = run_study(study, StudyOptions(), out=tmp_path / "out", device="cpu", analyze=False, executor=ex)
    killed_pid = int((tmp_path / "started-2").read_text())
    store = RunStore(tmp_path / "out" / "toy-kill")
    specs = _toy_specs(StudyOptions())
    for s in specs:
        r = store.load_result(s)
        assert r["value"] == _toy_value(s.seed)
        w = store.load_state_dict(s)["w"]
        torch.testing.assert_close(w, torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0], dtype=torch.float64) / (s.seed + 3))
    assert store.load_result(specs[2])["pid"] != killed_pid  # rerun by a fresh worker process
    assert sorted(p.name for p in (store.root / "runs").iterdir()) == sorted(s.spec_hash() for s in specs)
    with xr.open_dataset(path, engine="netcdf4") as ds:
        np.testing.assert_allclose(ds["value"].values, [1 / 3, 1 / 4, 1 / 5, 1 / 6])


def test_local_cluster_starts_while_another_holds_the_default_dashboard_port():
    """Two studies on one machine: the second local cluster must not need port 8787."""
    import socket

    with socket.socket() as holder:
        try:
            holder.bind(("127.0.0.1", 8787))
            holder.listen()
        except OSError:
            pass  # already held by another process: the situation under test
        with DaskExecutor(workers=1, processes=False) as ex:
            assert dict(ex.map_unordered(lambda x: x + 1, [1, 2])) == {1: 2, 2: 3}


def test_map_unordered_on_an_existing_scheduler_yields_every_item_once():
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, dashboard_address=":0") as cluster:
        with DaskExecutor(scheduler=cluster.scheduler_address) as ex:
            got = dict(ex.map_unordered(lambda x: x * x + 1, [3, 1, 4, 1.5]))
        assert got == {3: 10, 1: 2, 4: 17, 1.5: 3.25}
        assert cluster.status.name == "running"  # an existing cluster is not stopped by the executor


def test_an_existing_tcp_scheduler_passes_the_checks_and_runs_the_work():
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=":0") as cluster:
        assert cluster.scheduler_address.startswith("tcp://127.0.0.1:")
        with make_executor("dask", scheduler=cluster.scheduler_address, timeout=5) as ex:
            assert dict(ex.map_unordered(lambda x: 2 * x, [1, 2])) == {1: 2, 2: 4}


def test_bad_executor_options_raise_one_line():
    with pytest.raises(ValueError, match="unknown executor 'spark'; allowed: inprocess, dask"):
        make_executor("spark")
    with pytest.raises(ValueError, match="need --executor dask"):
        make_executor("inprocess", workers=2)
    assert isinstance(make_executor(), InProcessExecutor)
    with pytest.raises(SchedulerUnreachable, match="cannot reach the Dask scheduler at 'tcp://127.0.0.1:9' within 1 s"):
        DaskExecutor(scheduler="tcp://127.0.0.1:9", timeout=1)


@pytest.mark.parametrize("address", ["notaurl", "tcp://", "tcp://127.0.0.1", "127.0.0.1:0", "tcp://127.0.0.1:65536",
                                     "http://127.0.0.1:8786", "tcp://a b:1", "", "tcp://127.0.0.1:8786/x"])
def test_a_malformed_scheduler_address_is_bad_input_refused_before_dask_is_imported(address, tmp_path):
    import subprocess
    import textwrap

    code = textwrap.dedent(f"""
        import sys
        from dynlab.errors import DynlabInputError
        from dynlab.executors import make_executor
        try:
            make_executor("dask", scheduler={address!r})
        except DynlabInputError as exc:
            print(str(exc))
            assert "distributed" not in sys.modules and "dask" not in sys.modules, "dask was imported"
        else:
            raise SystemExit("accepted")
    """)
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert res.returncode == 0, res.stderr[-2000:]
    line = res.stdout.strip()
    assert "\n" not in line and repr(address) in line and "allowed: PROTOCOL://HOST:PORT" in line


def test_well_formed_scheduler_addresses_parse():
    assert parse_scheduler_address("127.0.0.1:8786") == ("tcp://127.0.0.1:8786", "127.0.0.1", 8786)
    assert parse_scheduler_address("tls://node-3.cluster:9000") == ("tls://node-3.cluster:9000", "node-3.cluster", 9000)
    assert parse_scheduler_address("tcp://[::1]:8786") == ("tcp://[::1]:8786", "::1", 8786)


def test_cli_malformed_scheduler_exits_2_and_unreachable_exits_1_in_one_line(tmp_path, monkeypatch, capfd):
    import socket

    import dynlab.executors
    from dynlab.cli import main

    monkeypatch.delenv("DYNLAB_DEBUG", raising=False)
    monkeypatch.setattr(dynlab.executors, "make_executor", functools.partial(make_executor, timeout=1))
    args = ["study", "group-tracking", "--models", "tanh-rnn", "--groups", "C2", "--executor", "dask",
            "--out", str(tmp_path), "-q", "--scheduler"]
    assert main([*args, "notaurl"]) == 2
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: --scheduler 'notaurl' is not a scheduler address"), err
    assert main([*args, "tcp://127.0.0.1:9"]) == 1  # nothing listens: refused at once
    err = capfd.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("error: cannot reach the Dask scheduler at 'tcp://127.0.0.1:9'"), err
    with socket.socket() as listener:  # something listens but is no scheduler: it never answers
        listener.bind(("127.0.0.1", 0))
        listener.listen(8)
        port = listener.getsockname()[1]
        code = main([*args, f"tcp://127.0.0.1:{port}"])
        import gc

        gc.collect()  # a half-made client would print its tracebacks now
    err = capfd.readouterr().err.strip().splitlines()
    assert code == 1 and len(err) == 1 and f"cannot reach the Dask scheduler at 'tcp://127.0.0.1:{port}'" in err[0], err
    assert not (tmp_path / "group-tracking").exists()
    assert main(["study", "group-tracking", "--models", "tanh-rnn", "--executor", "ray", "--out", str(tmp_path)]) == 2
    assert capfd.readouterr().err.strip() == "error: unknown executor 'ray'; allowed: inprocess, dask"


def _flaky_square(x: int, marker_dir: str) -> int:
    marker = Path(marker_dir) / f"raised-{x}"
    if not marker.exists():
        marker.write_text("1")
        raise RuntimeError(f"transient failure on {x}")
    return x * x


def test_a_task_that_raises_is_retried_then_fails_for_good_without_retries(tmp_path):
    with DaskExecutor(workers=1, processes=False, retries=1) as ex:
        (tmp_path / "a").mkdir()
        got = dict(ex.map_unordered(functools.partial(_flaky_square, marker_dir=str(tmp_path / "a")), [2, 3]))
    assert got == {2: 4, 3: 9}
    (tmp_path / "b").mkdir()
    with DaskExecutor(workers=1, processes=False, retries=0) as ex:
        with pytest.raises(RuntimeError, match="transient failure on 5"):
            dict(ex.map_unordered(functools.partial(_flaky_square, marker_dir=str(tmp_path / "b")), [5]))


def _fail_on_one(x: int) -> int:
    if x == 1:
        raise RuntimeError("permanent failure on 1")
    return x * 10


def test_a_failed_task_does_not_cancel_the_others(tmp_path):
    got = {}
    with DaskExecutor(workers=1, processes=False, retries=0) as ex:
        with pytest.raises(RuntimeError, match="permanent failure on 1"):
            for item, result in ex.map_unordered(_fail_on_one, [0, 1, 2, 3]):
                got[item] = result
    assert got == {0: 0, 2: 20, 3: 30}  # every other task finished and was handed over


@pytest.mark.slow
def test_analyses_overlapping_remote_training_equal_in_process_analyses(tmp_path):
    """With worker processes the runner analyses each finished run while the workers train
    the next; the stored analyses must equal those of an in-process study.  (With worker
    threads of the same process it must not overlap: an analysis reseeding torch's global
    RNG under a training thread changed that run's initial weights, and this test failed.)"""
    options = StudyOptions(preset="smoke", models=("tanh-rnn", "mamba"), extra={"groups": ("C2",), **TINY})
    run_study(GROUP_TRACKING, options, out=tmp_path / "inproc", device="cpu", analyze=True)
    with DaskExecutor(workers=1, processes=True) as ex:
        assert ex.remote is True and ex.shares_process is False  # what lets the analyses overlap (runner.loop)
        run_study(GROUP_TRACKING, options, out=tmp_path / "dask", device="cpu", analyze=True, executor=ex)
    a, b = tmp_path / "inproc" / "group-tracking", tmp_path / "dask" / "group-tracking"
    names = sorted(p.parent.name for p in (a / "runs").glob("*/analysis.nc"))
    assert len(names) == 2 and names == sorted(p.parent.name for p in (b / "runs").glob("*/analysis.nc"))
    for rid in names:
        with xr.open_dataset(a / "runs" / rid / "analysis.nc", engine="netcdf4") as da, \
                xr.open_dataset(b / "runs" / rid / "analysis.nc", engine="netcdf4") as db:
            for v in ("q", "q_pair", "q_dec", "probe_accuracy", "return_map_eig_real", "recovery_rate"):
                np.testing.assert_array_equal(da[v].values, db[v].values, err_msg=f"{rid} {v}")


def test_a_local_cluster_reports_its_workers():
    """The count the runner records as ``study_workers``."""
    with DaskExecutor(workers=2, processes=False) as ex:
        ex.client.wait_for_workers(2, timeout=30)
        assert ex.n_workers() == 2


def test_an_lm_stack_is_one_dask_task_with_the_in_process_results(tmp_path):
    """train.engine = stack: the 3 seeds x 2 arms travel as one work item to a Dask worker
    process and come back with the results of the same stack trained in process."""
    from dynlab.studies.length_generalization import STUDY as LG

    tiny = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
            "train": {"steps": 3, "batch_size": 2, "seq_len": 16, "engine": "stack"},
            "eval": {"length_multiple": 4, "n_samples": 3, "chunk_len": 16, "bin_width": 8, "effrem_points": 3,
                     "effrem_samples": 2}, "interventions": ["zero", "state-passing"]}
    options = StudyOptions(preset="quick", seeds=(0, 1, 2), extra=tiny)
    from dynlab.studies.length_generalization import make_specs

    assert len(LG.work_items(make_specs(options))) == 1
    local = open_study(run_study(LG, options, out=tmp_path / "local", device="cpu"))
    with DaskExecutor(workers=1, processes=True) as ex:
        remote = open_study(run_study(LG, options, out=tmp_path / "dask", device="cpu", executor=ex))
    assert (remote["ensemble_size"] == 6).all()
    np.testing.assert_array_equal(local["train_loss"].values, remote["train_loss"].values)
    np.testing.assert_array_equal(local["ppl"].values, remote["ppl"].values)
