"""A local Dask cluster on a machine with GPUs: one worker per GPU, each task on its worker's own GPU."""

from __future__ import annotations

import threading

import pytest

pytest.importorskip("distributed")

import dynlab.executors as executors  # noqa: E402


def test_one_worker_per_visible_gpu_each_pinned_to_its_own(monkeypatch):
    """With 2 GPUs faked: 2 workers without --workers; every task pins its worker's GPU in
    the thread that runs it, worker 0 on cuda:0 and worker 1 on cuda:1, whichever task."""
    monkeypatch.setattr(executors, "visible_gpus", lambda: 2)
    # the pin is recorded on the thread that runs the task (tasks travel pickled: no shared dict)
    monkeypatch.setattr(executors, "pin_gpu", lambda index: setattr(threading.current_thread(), "dynlab_gpu", index))

    def work(item: int):
        import threading

        from distributed import get_worker

        return get_worker().name, threading.current_thread().dynlab_gpu

    with executors.DaskExecutor(processes=False) as ex:
        assert ex.n_workers() == 2
        results = [result for _, result in ex.map_unordered(work, range(12))]
    by_worker = {}
    for name, gpu in results:
        by_worker.setdefault(name, set()).add(gpu)
    assert by_worker and all(gpus == {executors.worker_gpu(name, 2)} for name, gpus in by_worker.items())
    assert {executors.worker_gpu(name, 2) for name in (0, 1)} == {0, 1}


def test_without_gpus_nothing_is_pinned(monkeypatch):
    monkeypatch.setattr(executors, "visible_gpus", lambda: 0)
    monkeypatch.setattr(executors, "pin_gpu", lambda index: pytest.fail("a GPU was pinned without GPUs"))
    with executors.DaskExecutor(processes=False, workers=1) as ex:
        assert [r for _, r in ex.map_unordered(lambda x: x + 1, [1, 2])] in ([2, 3], [3, 2])


def test_worker_names_map_to_gpus_stably():
    assert [executors.worker_gpu(n, 3) for n in (0, 1, 2, 3, "4")] == [0, 1, 2, 0, 1]
    assert executors.worker_gpu("tcp://10.0.0.1:1234", 4) == executors.worker_gpu("tcp://10.0.0.1:1234", 4)
