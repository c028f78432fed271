"""Where a study's work items run: in this process (default) or on a Dask cluster.

An executor maps a function over work items and yields ``(item, result)`` pairs as they
finish (any order).  The runner saves every result as it arrives, in the calling
process, so results are stored atomically whatever the executor.  A work item is a list
of specs trained together (one spec, or an ensemble of same-shape models).

:class:`DaskExecutor` submits one Dask task per work item, to an existing scheduler
(``scheduler="tcp://host:8786"``, e.g. one started by dask-jobqueue on SLURM) or to a
:class:`distributed.LocalCluster` of ``workers`` processes that it starts and stops
itself.  Fault tolerance:

- a task whose function *raises* is retried ``retries`` times (Dask's ``retries``);
- a task whose worker *dies* mid-run (killed, out of memory, node lost) is rescheduled
  by the scheduler on another (or the restarted) worker, up to the scheduler's
  ``distributed.scheduler.allowed-failures`` times (Dask default 3), after which the
  client gets ``KilledWorker``.
Results travel back to the client and nothing is written by workers, so a lost or
retried task can never leave a half-written run behind; runs saved before a fatal
error stay saved and a rerun resumes from them.

Dask is an optional extra (``pip install '.[dask]'``), imported only when a :class:`DaskExecutor` is made.

GPUs: a local cluster on a machine with N visible GPUs starts N workers unless told how
many, and each task runs on its worker's own GPU (worker k on ``cuda:k mod N``, set with
``torch.cuda.set_device`` in the task's thread before the work), so ``--device auto`` on a
worker means its GPU, not every worker's ``cuda:0``.

A scheduler address is checked before Dask is imported (:func:`parse_scheduler_address`):
a malformed one is bad input (one-line :class:`~dynlab.errors.DynlabInputError`).  A
well-formed address whose scheduler does not answer within ``timeout`` seconds (default
:data:`CONNECT_TIMEOUT_S`) is a failing machine, not bad input: one
:class:`SchedulerUnreachable` (a ``ConnectionError``) with a one-line message.
"""

from __future__ import annotations

import gc
import re
import socket
import sys
import uuid
from collections.abc import Callable, Iterable, Iterator
from typing import Any, Protocol

from dynlab.errors import DynlabInputError, DynlabMachineError
from dynlab.names import EXECUTORS

__all__ = ["CONNECT_TIMEOUT_S", "check_workers", "EXECUTORS", "SCHEDULER_SCHEMES", "DaskExecutor", "Executor",
           "InProcessExecutor", "SchedulerUnreachable", "in_other_processes", "make_executor",
           "parse_scheduler_address", "runs_here"]


#: Protocols of a scheduler address (``tcp://host:port``; no protocol means tcp).
SCHEDULER_SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")

#: Seconds to wait for an existing scheduler to answer.
CONNECT_TIMEOUT_S = 5.0

_ADDRESS = re.compile(
    r"^(?:(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://)?"
    r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?)"
    r":(?P<port>[0-9]{1,5})/?$"
)


def check_workers(workers: int, what: str = "--workers") -> int:
    """``workers`` when a local cluster may start that many processes here: 1 to
    :func:`dynlab.spec.max_local_workers`; else one line naming ``what`` and the range."""
    from dynlab.spec import max_local_workers

    most = max_local_workers()
    if isinstance(workers, bool) or not isinstance(workers, int) or not 1 <= workers <= most:
        raise DynlabInputError(f"{what} {workers} is out of range; allowed: 1 to {most} worker processes "
                               "(this machine's CPU cores, at least 4)")
    return workers


class SchedulerUnreachable(DynlabMachineError, ConnectionError):
    """A well-formed scheduler address whose scheduler did not answer (one-line message):
    the user's machine or network, not a bug (the command line says ``error: …``, exit 1)."""


def parse_scheduler_address(address: str) -> tuple[str, str, int]:
    """``(address, host, port)`` of a scheduler address ``[PROTOCOL://]HOST:PORT``
    (PROTOCOL one of :data:`SCHEDULER_SCHEMES`, default tcp; HOST a name, an IPv4 address or
    ``[IPv6]``; PORT 1 … 65535); the address is returned with its protocol.  Anything else
    is a one-line :class:`~dynlab.errors.DynlabInputError`.  Imports nothing."""
    if isinstance(address, str) and address.startswith("inproc://") and len(address) > len("inproc://"):
        return address, "", 0  # a scheduler in this very process (tests, notebooks)
    allowed = f"allowed: PROTOCOL://HOST:PORT with PROTOCOL one of {', '.join(SCHEDULER_SCHEMES)}, e.g. tcp://10.0.0.5:8786"
    m = _ADDRESS.match(address.strip()) if isinstance(address, str) else None
    if m is None:
        raise DynlabInputError(f"--scheduler {address!r} is not a scheduler address; {allowed}")
    scheme = (m["scheme"] or "tcp").lower()
    port = int(m["port"])
    if scheme not in SCHEDULER_SCHEMES:
        raise DynlabInputError(f"--scheduler {address!r}: unknown protocol {scheme!r}; {allowed}")
    if not 1 <= port <= 65535:
        raise DynlabInputError(f"--scheduler {address!r}: port {port} is out of range; {allowed} (PORT 1 to 65535)")
    host = m["host"]
    return f"{scheme}://{host}:{port}", host.strip("[]"), port


def _probe(address: str, host: str, port: int, timeout: float) -> None:
    """Raise :class:`SchedulerUnreachable` unless something accepts a TCP connection at
    ``host:port`` within ``timeout`` seconds."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            pass
    except OSError as exc:
        why = "timed out" if isinstance(exc, TimeoutError) else (exc.strerror or type(exc).__name__)
        raise SchedulerUnreachable(
            f"cannot reach the Dask scheduler at {address!r} within {timeout:g} s ({why}); is it running?"
        ) from None


def _handshake(address: str, timeout: float) -> None:
    """Raise :class:`SchedulerUnreachable` unless a Dask scheduler at ``address`` says who
    it is within ``timeout`` seconds (a port that accepts connections but never answers
    would otherwise hold the client forever).  Skipped inside a running event loop."""
    import asyncio

    from distributed.core import rpc

    try:
        asyncio.get_running_loop()
        return
    except RuntimeError:
        pass

    async def identity() -> dict:
        remote = rpc(address, timeout=timeout)
        try:
            return await remote.identity()
        finally:
            await remote.close_rpc()

    async def bounded() -> dict:
        return await asyncio.wait_for(identity(), timeout)

    try:
        who = asyncio.run(bounded())
    except (OSError, asyncio.TimeoutError, ValueError, TypeError) as exc:
        why = "no answer" if isinstance(exc, asyncio.TimeoutError) else (str(exc).splitlines() or [type(exc).__name__])[0]
        raise SchedulerUnreachable(
            f"cannot reach the Dask scheduler at {address!r} within {timeout:g} s ({why}); is it a Dask scheduler?"
        ) from None
    if not isinstance(who, dict) or who.get("type") != "Scheduler":
        kind = who.get("type") if isinstance(who, dict) else type(who).__name__
        raise SchedulerUnreachable(f"{address!r} answers as a {kind}, not as a Dask scheduler")


def _quietly_collect() -> None:
    """Collect a half-made Dask client now, without the tracebacks its ``__del__`` prints
    for a connection that never was."""
    hook = sys.unraisablehook
    sys.unraisablehook = lambda unraisable: None
    try:
        gc.collect()
    finally:
        sys.unraisablehook = hook


class Executor(Protocol):
    """What runs a study's work items: ``map_unordered(fn, items)`` yields ``(item, fn(item))``
    as each finishes.  Two optional attributes say where, read by :func:`runs_here` and
    :func:`in_other_processes`: ``remote`` and ``shares_process``."""

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]: ...


class InProcessExecutor:
    """Run items one after the other in this process (the default)."""

    remote = False

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        for item in items:
            yield item, fn(item)

    def n_workers(self) -> int:
        """One: this process."""
        return 1

    def close(self) -> None:
        return None

    def __enter__(self) -> InProcessExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _import_distributed():
    try:
        import distributed
    except ImportError:
        raise DynlabInputError(
            "the dask executor needs dask.distributed; install it with: pip install '.[dask]' in a dynlab checkout"
        ) from None
    return distributed


def runs_here(executor: Any) -> bool:
    """Whether ``executor`` runs work in this process (in-process, or ``remote = False``): the device
    is then resolved and the progress bars shown here; others (Dask, an executor that does not
    say) get the device option, resolved on each worker, and no progress bars."""
    return isinstance(executor, InProcessExecutor) or getattr(executor, "remote", None) is False


def in_other_processes(executor: Any) -> bool:
    """Whether ``executor``'s workers are other processes (``remote = True``, ``shares_process = False``)."""
    return getattr(executor, "remote", None) is True and getattr(executor, "shares_process", True) is False


class DaskExecutor:
    """One Dask task per work item, on an existing cluster or a local one (module docstring).

    Args:
        scheduler: address of a running scheduler (``tcp://host:port``); ``None`` starts a
            :class:`distributed.LocalCluster`.
        workers: number of worker processes of the local cluster (only without
            ``scheduler``), one thread each.
        retries: extra attempts for a task whose function raises.
        processes: local cluster with worker processes (True, default; each supervised by a
            nanny that restarts it when it dies) or threads in this process (False).
        timeout: seconds to wait for an existing scheduler to answer (then
            :class:`SchedulerUnreachable`).
        client: an existing ``distributed.Client`` to use (not closed by this executor).

    Use as a context manager (or call :meth:`close`) to stop a cluster it started.
    """

    remote = True

    #: True when the work runs in threads of this very process (a local cluster with
    #: ``processes=False``): torch's global state (the RNG that model initialisation
    #: forks, the thread count) is then shared with the caller, so the runner does not
    #: analyse finished runs while such workers train.
    shares_process = False

    def __init__(
        self,
        scheduler: str | None = None,
        workers: int | None = None,
        retries: int = 2,
        processes: bool = True,
        timeout: float = CONNECT_TIMEOUT_S,
        client: Any | None = None,
    ):
        if retries < 0:
            raise DynlabInputError(f"retries={retries}; allowed: an integer >= 0")
        if workers is not None:
            check_workers(workers, "workers")
        if scheduler is not None and workers is not None:
            raise DynlabInputError("give either --scheduler (an existing cluster) or --workers (a local one), not both")
        if not timeout > 0:
            raise DynlabInputError(f"timeout={timeout!r}; allowed: a number of seconds > 0")
        address = host = port = None
        if scheduler is not None and client is None:
            address, host, port = parse_scheduler_address(scheduler)  # before Dask is imported
        distributed = _import_distributed()
        self.retries = int(retries)
        self.gpus = 0  # GPUs a local cluster's workers are pinned to (an existing cluster's place themselves)
        self._cluster = None
        self._own_client = client is None
        if client is not None:
            self.client = client
            return
        if address is not None:
            if address.split("://")[0] not in ("ucx", "inproc"):
                _probe(address, host, port, timeout)
                _handshake(address, timeout)
            failure = None
            try:
                self.client = distributed.Client(address, timeout=timeout, set_as_default=False)
            except (OSError, TimeoutError, ValueError) as exc:
                failure = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
            if failure is not None:
                _quietly_collect()
                raise SchedulerUnreachable(
                    f"cannot reach the Dask scheduler at {address!r} within {timeout:g} s ({failure}); is it a Dask scheduler?"
                )
            return
        self.shares_process = not processes
        self.gpus = visible_gpus()
        self._cluster = distributed.LocalCluster(
            n_workers=workers or max(1, self.gpus),
            threads_per_worker=1,
            processes=processes,
            # a free port: the scheduler always serves HTTP, by default on 8787, and a
            # second study on the same machine must not fail on "Port 8787 is already in use"
            dashboard_address=":0",
        )
        self.client = distributed.Client(self._cluster, set_as_default=False)

    def map_unordered(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """Submit every item as one task; yield ``(item, result)`` as tasks finish.

        A task that fails for good does not cancel the others: they finish and are yielded
        (so the runner saves them), then the first error is raised."""
        from distributed import as_completed

        batch = uuid.uuid4().hex[:12]
        pending = {}
        task = _OnWorkerGPU(fn, self.gpus) if self.gpus else fn
        for i, item in enumerate(items):
            fut = self.client.submit(task, item, key=f"dynlab-item-{batch}-{i}", retries=self.retries, pure=False)
            pending[fut] = item
        first_error: BaseException | None = None
        try:
            for fut in as_completed(list(pending), loop=self.client.loop):
                item = pending.pop(fut)
                try:
                    result = fut.result()
                except Exception as exc:  # failed for good: let the other tasks finish and be saved
                    first_error = first_error or exc
                    continue
                yield item, result
        finally:
            for fut in pending:  # the caller stopped early
                fut.cancel()
        if first_error is not None:
            raise first_error

    def n_workers(self) -> int:
        """The workers the scheduler has now (a local cluster's ``workers``)."""
        return len(self.client.nthreads())

    def close(self) -> None:
        if self._own_client:
            self.client.close()
        if self._cluster is not None:
            self._cluster.close()
            self._cluster = None

    def __enter__(self) -> DaskExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def visible_gpus() -> int:
    """CUDA devices this process sees (0 without CUDA; torch is imported only to ask)."""
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0


def pin_gpu(index: int) -> None:
    """Make ``cuda:index`` the current device of the calling thread (``torch.device("cuda")``)."""
    import torch

    torch.cuda.set_device(index)


def worker_gpu(name: Any, gpus: int) -> int:
    """The GPU of the worker called ``name``: its number modulo ``gpus`` (a local cluster
    numbers its workers 0, 1, …; another name is hashed, the same on every call)."""
    try:
        index = int(name)
    except (TypeError, ValueError):
        index = sum(str(name).encode())
    return index % gpus


class _OnWorkerGPU:
    """A task function that first pins its worker's own GPU (:func:`worker_gpu`), then runs ``fn``."""

    def __init__(self, fn: Callable[[Any], Any], gpus: int) -> None:
        self.fn, self.gpus = fn, gpus

    def __call__(self, item: Any) -> Any:
        from distributed import get_worker

        pin_gpu(worker_gpu(get_worker().name, self.gpus))
        return self.fn(item)


def make_executor(
    name: str = "inprocess",
    scheduler: str | None = None,
    workers: int | None = None,
    retries: int = 2,
    timeout: float = CONNECT_TIMEOUT_S,
) -> InProcessExecutor | DaskExecutor:
    """The executor called ``name`` (one of :data:`EXECUTORS`); validates the options (a
    malformed ``scheduler`` is refused before Dask is imported)."""
    if name not in EXECUTORS:
        raise DynlabInputError(f"unknown executor {name!r}; allowed: {', '.join(EXECUTORS)}")
    if name == "inprocess":
        if scheduler is not None or workers is not None:
            raise DynlabInputError("--scheduler and --workers need --executor dask")
        return InProcessExecutor()
    if scheduler is not None:
        parse_scheduler_address(scheduler)
    return DaskExecutor(scheduler=scheduler, workers=workers, retries=retries, timeout=timeout)
