"""Runtime concerns shared by every part of dynlab, below everything that uses them.

- **Device** (:func:`resolve_device`): ``auto`` is CUDA when present, else the CPU — one
  code path for both.
- **Threads** (:func:`train_threads`, :data:`RUN_THREADS`): every run trains, evaluates
  and is analysed on a fixed CPU thread count, so its numbers do not depend on the machine.
- **Memory** (:func:`keep_freed_memory`): the process's CPU allocator keeps freed memory.
- **Progress** (:func:`make_progress`, :class:`NullProgress`): rich bars on a terminal;
  plain lines (:class:`PlainProgress`: one per finished run, a heartbeat on long work)
  when stderr is a pipe or a log file; or silence.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any

import torch

from dynlab.errors import DynlabInputError

__all__ = [
    "ALLOCATOR_ENV", "DEVICE_CHOICES", "HEARTBEAT_S", "MAX_THREADS", "NullProgress", "PlainProgress", "Progress",
    "RUN_THREADS", "keep_freed_memory",
    "make_progress", "resolve_device", "say", "train_threads",
]

#: Environment variable that turns :func:`keep_freed_memory` off (``0``).
ALLOCATOR_ENV = "DYNLAB_KEEP_FREED_MEMORY"

_ALLOCATOR: dict[str, bool] = {}

DEVICE_CHOICES = ("auto", "cpu", "cuda")


def resolve_device(device: str | torch.device = "auto") -> torch.device:
    """Turn ``auto | cpu | cuda | cuda:N`` into a ``torch.device``; refuse unavailable ones."""
    if isinstance(device, torch.device):
        return device
    name = str(device).strip().lower()
    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if name == "cpu":
        return torch.device("cpu")
    if name.startswith("cuda"):
        if not torch.cuda.is_available():
            raise DynlabInputError(f"device {device!r} requested but CUDA is not available; allowed here: auto, cpu")
        return torch.device(name)
    raise DynlabInputError(f"unknown device {device!r}; allowed: {', '.join(DEVICE_CHOICES)} (or cuda:N)")


# glibc mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD, _M_TOP_PAD, _M_MMAP_THRESHOLD = -1, -2, -3


def keep_freed_memory() -> bool:
    """Let this process reuse the memory it frees instead of returning it to the kernel
    (Linux with glibc only; once per process; returns whether the settings are in effect).

    A CPU training step allocates and frees tensors of megabytes (activations, gradients).
    With glibc's defaults each one above a few MiB is a fresh ``mmap`` or heap growth whose
    pages fault in on first touch, and freed memory is handed back at once, so a CPU study
    can spend a large share of its time in the kernel (``docs/performance.md``).  This sets ``M_MMAP_THRESHOLD`` to
    32 MiB (glibc's largest; larger blocks are still mapped), ``M_TRIM_THRESHOLD`` to
    1 GiB and ``M_TOP_PAD`` to 64 MiB, so freed blocks stay in the heap for the next step.
    The cost is memory: each glibc arena (one per thread that allocates, at most a few per
    core) keeps up to about 1 GiB of freed heap.  Numbers do not
    change (only where memory comes from).  ``DYNLAB_KEEP_FREED_MEMORY=0`` turns it off;
    :func:`train_threads`, which every training, evaluation and
    analysis enters, calls it.
    """
    if "on" in _ALLOCATOR:
        return _ALLOCATOR["on"]
    _ALLOCATOR["on"] = False
    if os.environ.get(ALLOCATOR_ENV, "1") == "0" or not sys.platform.startswith("linux"):
        return False
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # not glibc (musl has no mallopt): leave the defaults
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    results = [mallopt(param, value) for param, value in (
        (_M_MMAP_THRESHOLD, 32 << 20), (_M_TRIM_THRESHOLD, 1 << 30), (_M_TOP_PAD, 64 << 20))]
    ok = all(r == 1 for r in results)  # every setting is tried; True only if all took
    _ALLOCATOR["on"] = ok
    return ok


#: CPU intra-op threads of every run (training, evaluation, analyses), whatever the
#: machine, the ensemble size or the executor.  The thread count changes how GEMMs and
#: reductions block their sums, hence the rounding, so a count taken from the machine
#: (``torch.get_num_threads()``) or from the size of an ensemble would make the same spec
#: give different numbers in different places.  One thread is also the fast choice at
#: dynlab's sizes (``docs/performance.md``).  Use more cores by running several runs at
#: once (``--executor dask --workers N``).
RUN_THREADS = 1

#: Largest thread count :func:`train_threads` accepts.
MAX_THREADS = 1024


@contextmanager
def train_threads(device: torch.device | str, *, threads: int | None = None) -> Iterator[int]:
    """Run the block with ``threads`` CPU intra-op threads (None: :data:`RUN_THREADS`).

    The default does not depend on the machine or on the work, so a run's numbers do not
    either (see :data:`RUN_THREADS`); an explicit count is for speed measurements and
    changes the rounding.  Yields the thread count in effect and restores the previous
    count afterwards.  On other devices the CPU count is set as well (host-side ops).
    """
    if threads is not None and not (isinstance(threads, int) and 1 <= threads <= MAX_THREADS):
        raise ValueError(f"threads must be an integer in 1..{MAX_THREADS} or None, got {threads!r}")
    torch.device(device)  # refuse a malformed device
    want = RUN_THREADS if threads is None else threads
    keep_freed_memory()  # once per process: freed activations are reused, not faulted in again
    old = torch.get_num_threads()
    if want == old:
        yield old
        return
    torch.set_num_threads(want)
    try:
        yield want
    finally:
        torch.set_num_threads(old)


class NullProgress(AbstractContextManager):
    """A progress sink that shows nothing (tests, library use)."""

    def add(self, description: str, total: int | None) -> int:
        return 0

    def update(self, task: int, advance: int = 1, **fields: Any) -> None:
        return None

    def describe(self, task: int, description: str) -> None:
        return None

    def log(self, message: str) -> None:
        return None

    def remove(self, task: int) -> None:
        return None

    def finished(self, message: str) -> bool:
        """A run has finished (``message``: one line about it); whether the line was printed
        (bars show a finished run by themselves)."""
        return False

    def __exit__(self, *exc: object) -> None:
        return None



def say(progress: NullProgress, message: str) -> None:
    """One line for the user: through the progress display when there is one, else on stderr."""
    if type(progress) is NullProgress:
        print(message, file=sys.stderr)
    else:
        progress.log(message)

class Progress(NullProgress):
    """Rich progress bars on stderr: one bar per task (e.g. runs, steps of the current run)."""

    def __init__(self) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, TextColumn, TimeElapsedColumn, TimeRemainingColumn
        from rich.progress import Progress as RichProgress

        self._console = Console(file=sys.stderr)
        self._p = RichProgress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            TimeRemainingColumn(),
            TextColumn("{task.fields[info]}"),
            console=self._console,
            transient=False,
        )

    def __enter__(self) -> Progress:
        self._p.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._p.stop()

    def add(self, description: str, total: int | None) -> int:
        return self._p.add_task(description, total=total, info="")

    def update(self, task: int, advance: int = 1, **fields: Any) -> None:
        info = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in fields.items())
        self._p.update(task, advance=advance, info=info)

    def describe(self, task: int, description: str) -> None:
        self._p.update(task, description=description)

    def log(self, message: str) -> None:
        self._p.console.print(message)

    def remove(self, task: int) -> None:
        self._p.remove_task(task)


#: Seconds of silence after which :class:`PlainProgress` prints a heartbeat line.
HEARTBEAT_S = 30.0


def _duration(seconds: float) -> str:
    seconds = max(0.0, seconds)
    if seconds < 60:
        return f"{seconds:.1f} s"
    minutes, s = divmod(int(round(seconds)), 60)
    return f"{minutes} min {s:02d} s" if minutes < 60 else f"{minutes // 60} h {minutes % 60:02d} min"


class PlainProgress(NullProgress):
    """Progress as plain lines on stderr, for a pipe or a log file (a SLURM log, ``| tee``),
    where rich bars would print nothing until the end: one line per finished run
    (:meth:`finished`), each :meth:`log` line as it comes, and, when nothing was printed for
    ``heartbeat_s`` seconds while work goes on, one heartbeat line naming each task in
    progress with its count and last fields (``mamba2/zero 812/1500 loss=2.31``) and the time
    since the start (checked at every update and, inside ``with``, once a second by a
    background thread, so an evaluation or a remote worker that reports nothing still gets
    its heartbeat).  No escape codes, no bars; every line is flushed at once."""

    def __init__(self, stream: Any = None, heartbeat_s: float = HEARTBEAT_S, clock: Any = time.monotonic) -> None:
        self._stream = stream
        self._heartbeat_s = heartbeat_s
        self._clock = clock
        self._start = self._last = clock()
        self._tasks: dict[int, dict[str, Any]] = {}
        self._next = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def __enter__(self) -> PlainProgress:
        self._stop.clear()
        self._thread = threading.Thread(target=self._watch, name="dynlab-heartbeat", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _watch(self) -> None:
        while not self._stop.wait(min(1.0, self._heartbeat_s)):
            self.beat()

    def beat(self) -> None:
        """Print a heartbeat line if nothing was printed for ``heartbeat_s`` seconds while a task is in progress."""
        with self._lock:
            if self._tasks and self._clock() - self._last >= self._heartbeat_s:
                self._print(self._heartbeat())

    def _print(self, line: str) -> None:
        stream = self._stream if self._stream is not None else sys.stderr
        print(line, file=stream, flush=True)
        self._last = self._clock()

    def add(self, description: str, total: int | None) -> int:
        with self._lock:
            self._next += 1
            self._tasks[self._next] = {"description": description, "total": total, "done": 0, "info": ""}
            return self._next

    def update(self, task: int, advance: int = 1, **fields: Any) -> None:
        with self._lock:
            state = self._tasks.get(task)
            if state is not None:
                state["done"] += advance
                if fields:
                    state["info"] = " ".join(f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}"
                                             for k, v in fields.items())
        self.beat()

    def _heartbeat(self) -> str:
        parts = []
        for state in self._tasks.values():
            count = f"{state['done']}/{state['total']}" if state["total"] is not None else f"{state['done']}"
            parts.append(" ".join(p for p in (state["description"], count, state["info"]) if p))
        return f"… {'; '.join(parts) or 'working'} ({_duration(self._clock() - self._start)})"

    def describe(self, task: int, description: str) -> None:
        with self._lock:
            if task in self._tasks:
                self._tasks[task]["description"] = description

    def log(self, message: str) -> None:
        with self._lock:
            self._print(message)

    def finished(self, message: str) -> bool:
        with self._lock:
            self._print(message)
        return True

    def remove(self, task: int) -> None:
        with self._lock:
            self._tasks.pop(task, None)


def _is_terminal(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError, OSError):  # a closed or replaced stream
        return False


def make_progress(show: bool) -> NullProgress:
    """Rich bars when ``show`` and stderr is a terminal, plain lines (:class:`PlainProgress`)
    when ``show`` and it is not, else silence."""
    if not show:
        return NullProgress()
    return Progress() if _is_terminal(sys.stderr) else PlainProgress()
