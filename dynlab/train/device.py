"""Device selection (``auto`` is CUDA when present, else the CPU — one code path for both)
and the process's CPU memory allocator settings (:func:`keep_freed_memory`)."""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import sys

import torch

from dynlab.errors import DynlabInputError

__all__ = ["ALLOCATOR_ENV", "DEVICE_CHOICES", "keep_freed_memory", "resolve_device"]

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
    :func:`dynlab.train.engine.train_threads`, which every training, evaluation and
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
