"""Provenance of the execution path: what computed a run's numbers.

:func:`provenance` is one JSON-able dict, recorded in every run's ``result.json`` (key
``provenance``, written by :meth:`dynlab.results.store.RunStore.save`), in the study's
``manifest.json`` and in the attrs of every dataset dynlab writes (``provenance_json``).
Its keys:

- ``dynlab``, ``python``, ``torch`` (version), ``torch_cuda`` (CUDA version of the torch
  build, or None), ``numpy``;
- ``machine`` (``platform.machine()``), ``cpu_model`` and ``cpu_flags``: the instruction-set
  flags that select kernels (AVX2, AVX-512, AMX, FMA; NEON/SVE on ARM) as ``/proc/cpuinfo``
  lists them, and ``torch_cpu_capability``, the vector level torch dispatches its CPU
  kernels for (``torch.backends.cpu.get_cpu_capability()``);
- ``cuda_devices``: the names of the visible GPUs (empty without CUDA); ``device``: the
  device the work ran on, when the caller names it (a run's: ``cpu``, ``cuda:0``);
- ``c_kernels``: per compiled C kernel asked for, ``compiled`` (the C loops ran) or why the
  torch loops ran (``disabled``, ``unavailable: …``); ``c_compiler``: the compiler and its
  version (:func:`dynlab.kernels.compiled.compiler`);
- ``scan_backends``: per scan operation, the backends that ran (``torch``, ``triton``,
  ``mamba_ssm``; :mod:`dynlab.kernels.dispatch`);
- ``env``: every ``DYNLAB_*`` environment variable in force, and the variables that change
  which kernels run (``CC``, ``TRITON_INTERPRET``, ``OMP_NUM_THREADS``, ``MKL_NUM_THREADS``,
  ``CUDA_VISIBLE_DEVICES``) when set.

``c_kernels`` and ``scan_backends`` describe one block of work when it ran inside
:func:`recording` (the runner records each work item where it runs, a Dask worker
included), else everything this process ran so far.  Work items running at the same time
in threads of one process (a local Dask cluster of threads) each see the kernels of all.
"""

from __future__ import annotations

import datetime as _dt
import json
import os
import platform
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

__all__ = ["KERNEL_ENV", "Recording", "cpu_features", "machine_record", "provenance", "read_provenance", "recording"]

#: Environment variables besides ``DYNLAB_*`` that change which kernels run.
KERNEL_ENV = ("CC", "TRITON_INTERPRET", "OMP_NUM_THREADS", "MKL_NUM_THREADS", "CUDA_VISIBLE_DEVICES")

#: ``/proc/cpuinfo`` flags that select kernels (x86 and ARM spellings).
_KERNEL_FLAGS = (
    "sse4_2", "avx", "avx2", "fma", "f16c", "avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512cd",
    "avx512_vnni", "avx512_bf16", "avx512_fp16", "avx_vnni", "amx_tile", "amx_bf16", "amx_int8",
    "asimd", "asimdhp", "asimddp", "sve", "sve2", "bf16", "i8mm",
)


@cache
def cpu_features() -> tuple[str, tuple[str, ...]]:
    """``(cpu model, kernel-selecting instruction-set flags)`` of this machine (first
    processor of ``/proc/cpuinfo``; ``platform.processor()`` and no flags elsewhere)."""
    model, flags = "", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "Hardware", "CPU part") and not model:
                model = value.strip()
            elif key in ("flags", "Features") and not flags:
                flags = set(value.split())
    except OSError:
        pass
    return model or platform.processor() or platform.machine(), tuple(f for f in _KERNEL_FLAGS if f in flags)


class Recording:
    """What ran inside one :func:`recording` block: compiled kernels and scan backends."""

    def __init__(self, c_kernels: dict[str, str], scan_backends: dict[str, set[str]]):
        self.c_kernels = c_kernels
        self.scan_backends = scan_backends


@contextmanager
def recording() -> Iterator[Recording]:
    """Record which compiled kernels and scan backends run inside the block; pass the
    yielded :class:`Recording` to :func:`provenance` afterwards."""
    from dynlab.kernels.compiled import record_c_kernels
    from dynlab.kernels.dispatch import record_backends

    with record_c_kernels() as c, record_backends() as b:
        yield Recording(c, b)


def _torch_part() -> dict[str, Any]:
    import torch

    try:
        capability = torch.backends.cpu.get_cpu_capability()
    except Exception:  # noqa: BLE001 - older torch builds lack it
        capability = None
    try:
        gpus = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())] if torch.cuda.is_available() else []
    except Exception:  # noqa: BLE001 - a broken driver: say nothing rather than fail a run
        gpus = []
    return {"torch": torch.__version__, "torch_cuda": torch.version.cuda, "torch_cpu_capability": capability,
            "cuda_devices": gpus}


def provenance(recorded: Recording | None = None, device: Any = None) -> dict[str, Any]:
    """The execution path of this process (module docstring); ``recorded``: the compiled
    kernels and scan backends of one :func:`recording` block instead of the whole process's;
    ``device``: the device the work ran on (recorded as ``device``; None leaves it out)."""
    import numpy

    import dynlab
    from dynlab.kernels.compiled import c_kernels_used, compiler
    from dynlab.kernels.dispatch import backends_used

    model, flags = cpu_features()
    if recorded is None:
        c_kernels, scans = c_kernels_used(), backends_used()
    else:
        c_kernels = dict(sorted(recorded.c_kernels.items()))
        scans = {op: sorted(b) for op, b in sorted(recorded.scan_backends.items())}
    env = {k: v for k, v in sorted(os.environ.items()) if k.startswith("DYNLAB_") or k in KERNEL_ENV}
    return {
        "dynlab": dynlab.__version__,
        "python": platform.python_version(),
        **_torch_part(),
        "numpy": numpy.__version__,
        "machine": platform.machine(),
        "platform": sys.platform,
        "cpu_model": model,
        "cpu_flags": list(flags),
        "c_kernels": c_kernels,
        "c_compiler": compiler() if c_kernels else None,
        "scan_backends": scans,
        "env": env,
        **({} if device is None else {"device": str(device)}),
    }


def machine_record() -> dict[str, Any]:
    """The machine a benchmark ran on, as every benchmark JSON file records it (key
    ``machine``; :func:`dynlab.bench.write_bench_json`): ``cpu_model`` (:func:`cpu_features`),
    ``cores`` (logical CPUs, ``os.cpu_count()``), ``cores_available`` (those this process may
    run on, ``os.sched_getaffinity``, where the platform has it), ``torch`` (version),
    ``cuda_devices`` (names of the visible GPUs) and ``created_utc`` (now, ISO 8601, seconds)."""
    affinity = getattr(os, "sched_getaffinity", None)
    torch_part = _torch_part()
    return {
        "cpu_model": cpu_features()[0],
        "cores": os.cpu_count(),
        "cores_available": len(affinity(0)) if affinity is not None else None,
        "torch": torch_part["torch"],
        "cuda_devices": torch_part["cuda_devices"],
        "created_utc": _dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"),
    }


def read_provenance(attrs: Mapping[str, Any]) -> dict[str, Any]:
    """The execution path a dataset recorded (its attribute ``provenance_json``, as
    :func:`provenance` made it), or ``{}`` when it has none or it does not parse."""
    try:
        return json.loads(attrs.get("provenance_json", "{}")) or {}
    except (TypeError, ValueError):
        return {}
