"""One dispatch table for the scans: Triton (or mamba-ssm) on CUDA, the torch path on the CPU.

:data:`TABLE` maps each operation to its implementations by backend name:

============== ===================================== ========================== =====================================
operation      ``torch`` (CPU, any device)            ``triton`` (CUDA)          ``mamba_ssm`` (CUDA, optional)
============== ===================================== ========================== =====================================
linear_scan    :func:`kernels.scan.linear_scan`       ``linear_scan_triton``     —
ssd            :func:`kernels.ssd.ssd_chunked`        ``ssd_triton``             ``mamba_chunk_scan_combined``
gla            :func:`kernels.gla.gla_chunked`        ``gla_triton``             —
selective_scan :func:`kernels.selective_scan.         ``selective_scan_triton``  ``selective_scan_fn`` (+ initial
               selective_scan_fused`                                             state added in torch)
============== ===================================== ========================== =====================================

All implementations of one operation take the same arguments and return the same thing.
:func:`choose_backend` picks, for a device and dtype: ``mamba_ssm`` on CUDA when the
package imports and has the operation; otherwise ``triton`` on CUDA when triton is
installed and the dtype is one the kernel takes; otherwise ``torch``.  The environment
variable ``DYNLAB_KERNEL_BACKEND`` (``auto`` by default, or ``torch``, ``triton``,
``mamba_ssm``) forces one backend where it has the operation (``triton`` on the CPU
needs ``TRITON_INTERPRET=1``; that is how the tests run the kernels).

Which backend ran is recorded for provenance: :func:`backends_used` lists, per operation,
every backend :func:`choose_backend` picked in this process, and :func:`record_backends`
collects the same for one block of work (a run).
The ``torch`` backend names the path that runs on any device. On the CPU it calls the C
loops where they are built (the selective scan's here; the LM stacks' GLA recurrence, SSD
and convolution through their own modules), and which of those ran, or why not, is recorded
beside the backend by :func:`kernels.compiled.c_kernels_used`, as a run's provenance shows.

Implementations are imported on first use: triton only when a Triton kernel is picked,
mamba-ssm only when CUDA is present, never on the CPU (its package does not import on a
CPU-only torch).  This module itself imports only torch and :mod:`.compiled`.

Mixed input dtypes pick the backend of their promoted dtype
(:func:`kernels.compiled.common_dtype`): float32 inputs with a float64 state take the torch
path, which computes in float64, not a float32 Triton kernel.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Callable

import torch

from .compiled import common_dtype

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "HAS_TRITON",
    "TABLE",
    "backends_used",
    "choose_backend",
    "get_kernel",
    "gla",
    "linear_scan",
    "mamba_ssm_available",
    "record_backends",
    "resolve",
    "selective_scan",
    "ssd",
]

ENV_VAR = "DYNLAB_KERNEL_BACKEND"
BACKENDS = ("torch", "triton", "mamba_ssm")
HAS_TRITON = importlib.util.find_spec("triton") is not None  # found, not imported: import is lazy

# dtypes each Triton kernel computes in (others take the torch path)
_COMPLEX_SCAN = {torch.float32, torch.float64, torch.complex64, torch.complex128}
_FLOAT32ISH = {torch.float32, torch.float16, torch.bfloat16}
_TRITON_DTYPES = {"linear_scan": _COMPLEX_SCAN, "ssd": _FLOAT32ISH, "gla": _FLOAT32ISH, "selective_scan": _FLOAT32ISH}

_MAMBA: dict[str, Any] = {}


def mamba_ssm_available() -> bool:
    """True when mamba-ssm's CUDA ops import (only ever tried with CUDA present). A
    mamba-ssm that is installed but fails to import (an ABI mismatch with torch, a missing
    CUDA extension) is one warning naming the package and the error, once per process;
    its operations then take the next backend."""
    if "ok" not in _MAMBA:
        _MAMBA["ok"] = False
        if torch.cuda.is_available():
            try:
                from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
                from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
            except ModuleNotFoundError as exc:
                if exc.name is not None and exc.name.split(".")[0] != "mamba_ssm":  # installed, a dependency missing
                    _warn_broken("mamba-ssm", exc)
            except Exception as exc:  # noqa: BLE001 - an installed package that fails: said, then not used
                _warn_broken("mamba-ssm", exc)
            else:
                _MAMBA.update(ok=True, ssd=mamba_chunk_scan_combined, selective_scan=selective_scan_fn)
    return _MAMBA["ok"]


def _warn_broken(package: str, exc: BaseException) -> None:
    """One warning: ``package`` is installed but does not import (its kernels are not used)."""
    import warnings

    why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    warnings.warn(f"{package} is installed but does not import ({why[:200]}); dynlab uses its next backend instead",
                  RuntimeWarning, stacklevel=3)


def _ssd_mamba(x, dt, A, B, C, initial_state=None, return_final_state=False, chunk_size=64):
    """``ssd_chunked``'s contract on ``mamba_chunk_scan_combined`` (B, C with one group per head)."""
    y, final = _MAMBA["ssd"](
        x.contiguous(), dt.contiguous(), A, B.contiguous(), C.contiguous(), chunk_size,
        initial_states=initial_state, return_final_states=True,
    )  # y [B, T, H, P], final [B, H, P, N]
    return (y, final) if return_final_state else y


def _selective_scan_mamba(u, delta, A, B, C, initial_state=None, return_final_state=False, chunk_size=32):
    """``selective_scan_ref``'s contract on ``selective_scan_fn``, which has no initial
    state: the initial state's contribution, exp(Σ_{r≤t} Δ_r A) h0 read out by C_t, is
    added to the zero-state output (and to the final state)."""
    y, last = _MAMBA["selective_scan"](
        u.transpose(1, 2).contiguous(), delta.transpose(1, 2).contiguous(), A.contiguous(),
        B.transpose(1, 2).contiguous(), C.transpose(1, 2).contiguous(), return_last_state=True,
    )  # y [B, D, T], last [B, D, N]
    y = y.transpose(1, 2)  # [B, T, D]
    if initial_state is not None:
        decay = torch.exp(torch.cumsum(delta[..., None] * A, dim=1))  # [B, T, D, N]
        y = y + torch.einsum("btdn,bdn,btn->btd", decay, initial_state, C)
        last = last + decay[:, -1] * initial_state
    return (y, last) if return_final_state else y


# "module:function" inside this package, imported on first use (triton only when asked for)
TABLE: dict[str, dict[str, str]] = {
    "linear_scan": {"torch": "scan.chunked:linear_scan", "triton": "scan.triton:linear_scan_triton"},
    "ssd": {"torch": "ssd.chunked:ssd_chunked", "triton": "ssd.triton:ssd_triton", "mamba_ssm": "dispatch:_ssd_mamba"},
    "gla": {"torch": "gla.chunked:gla_chunked", "triton": "gla.triton:gla_triton"},
    "selective_scan": {
        "torch": "selective_scan.chunked:selective_scan_fused",
        "triton": "gla.triton:selective_scan_triton",
        "mamba_ssm": "dispatch:_selective_scan_mamba",
    },
}


@functools.cache
def resolve(entry: str) -> Callable:
    """The function a :data:`TABLE` entry names."""
    module, name = entry.split(":")
    return getattr(importlib.import_module(f"{__package__}.{module}"), name)


# backends picked, per operation: [0] in this whole process, then one per active record_backends()
_USED: list[dict[str, set[str]]] = [{}]


def backends_used() -> dict[str, list[str]]:
    """Every backend :func:`choose_backend` picked in this process, per operation (sorted)."""
    return {op: sorted(b) for op, b in sorted(_USED[0].items())}


@contextmanager
def record_backends() -> Iterator[dict[str, set[str]]]:
    """Within the block, collect into the yielded dict the backends picked per operation."""
    seen: dict[str, set[str]] = {}
    _USED.append(seen)
    try:
        yield seen
    finally:
        _USED[:] = [d for d in _USED if d is not seen]  # by identity: two recordings may hold equal dicts


def forced_backend_problem() -> str | None:
    """Why ``DYNLAB_KERNEL_BACKEND`` forces a backend this machine cannot run — Triton
    without a GPU (unless its interpreter is on, ``TRITON_INTERPRET=1``), mamba-ssm where it
    does not import — in one line, or None (the command line says it as bad input: the
    user's choice, not a failure)."""
    forced = os.environ.get(ENV_VAR, "auto")
    if forced == "triton" and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return (f"{ENV_VAR}=triton but this machine has no CUDA GPU for Triton's kernels; allowed: auto or torch "
                "here (or TRITON_INTERPRET=1 for Triton's interpreter)")
    if forced == "mamba_ssm" and not mamba_ssm_available():
        return (f"{ENV_VAR}=mamba_ssm but mamba-ssm does not import here (it needs a CUDA GPU and the package); "
                "allowed: auto, torch or triton")
    return None


def choose_backend(op: str, device: torch.device | str, dtype: torch.dtype = torch.float32) -> str:
    """Backend name for ``op`` on ``device`` with inputs of ``dtype`` (see the module
    docstring); recorded (:func:`backends_used`)."""
    backend = _choose(op, device, dtype)
    for seen in _USED:
        seen.setdefault(op, set()).add(backend)
    return backend


def _choose(op: str, device: torch.device | str, dtype: torch.dtype) -> str:
    if op not in TABLE:
        raise ValueError(f"unknown operation {op!r}; allowed: {', '.join(TABLE)}")
    forced = os.environ.get(ENV_VAR, "auto")
    if forced not in ("auto", *BACKENDS):
        raise ValueError(f"{ENV_VAR}={forced!r}; allowed: auto, {', '.join(BACKENDS)}")
    if forced != "auto":
        if forced == "triton" and not HAS_TRITON:
            raise RuntimeError(f"{ENV_VAR}=triton but triton is not installed (pip install 'dynlab[triton]')")
        if forced == "mamba_ssm" and not mamba_ssm_available():
            raise RuntimeError(f"{ENV_VAR}=mamba_ssm but mamba-ssm does not import here (it needs CUDA)")
        return forced if forced in TABLE[op] else "torch"
    if torch.device(device).type != "cuda":
        return "torch"
    if "mamba_ssm" in TABLE[op] and dtype in _TRITON_DTYPES[op] and mamba_ssm_available():
        return "mamba_ssm"
    if HAS_TRITON and dtype in _TRITON_DTYPES[op]:
        return "triton"
    return "torch"


def get_kernel(op: str, device: torch.device | str, dtype: torch.dtype = torch.float32) -> Callable:
    """The implementation of ``op`` that :func:`choose_backend` picks."""
    return resolve(TABLE[op][choose_backend(op, device, dtype)])


def linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """Diagonal scan h_t = a_t ⊙ h_{t−1} + b_t on the chosen backend (``kernels.scan.linear_scan``'s contract)."""
    return get_kernel("linear_scan", a.device, common_dtype(a, b, h0))(a, b, h0, chunk)


def ssd(x, dt, A, B, C, initial_state=None, return_final_state=False, chunk_size=64):
    """Mamba-2 SSD on the chosen backend (``kernels.ssd.ssd_chunked``'s contract)."""
    kernel = get_kernel("ssd", x.device, common_dtype(x, dt, A, B, C, initial_state))
    return kernel(x, dt, A, B, C, initial_state, return_final_state, chunk_size)


def gla(q, k, v, gk, scale=None, initial_state=None, return_final_state=False, chunk_size=32):
    """GLA on the chosen backend (``kernels.gla.gla_chunked``'s contract)."""
    kernel = get_kernel("gla", q.device, common_dtype(q, k, v, gk, initial_state))
    return kernel(q, k, v, gk, scale, initial_state, return_final_state, chunk_size)


def selective_scan(u, delta, A, B, C, initial_state=None, return_final_state=False, chunk_size=32):
    """Mamba-1 selective scan on the chosen backend (``selective_scan_ref``'s contract).

    The torch backend is :func:`kernels.selective_scan.selective_scan_fused`: on the CPU a
    small compiled C kernel where a C compiler is available (:mod:`kernels.compiled`), else
    cache-sized torch steps with a hand-written backward (``docs/performance.md`` has the
    measured ratios).
    """
    fn = get_kernel("selective_scan", u.device, common_dtype(u, delta, A, B, C, initial_state))
    return fn(u, delta, A, B, C, initial_state, return_final_state, chunk_size)
