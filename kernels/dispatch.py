"""One dispatch table for the scans: the field's kernels (or Triton) on CUDA, the torch path on the CPU.

:data:`TABLE` maps each operation to its implementations by backend name:

============== ================================ ========================= ===========================================
operation      ``torch`` (CPU, any device)       ``triton`` (CUDA)         library backend (CUDA, when installed)
============== ================================ ========================= ===========================================
linear_scan    :func:`kernels.scan.linear_scan`  ``linear_scan_triton``    —
               (fwd + bwd kernels)
ssd            :func:`kernels.ssd.ssd_chunked`   ``ssd_triton``            ``mamba_ssm``: ``mamba_chunk_scan_combined``
                                                 (forward only)
gla            :func:`kernels.gla.gla_chunked`   ``gla_triton``            ``fla``: ``chunk_gla``
                                                 (forward only)
selective_scan :func:`kernels.selective_scan.    ``selective_scan_triton`` ``mamba_ssm``: ``selective_scan_fn`` (+ the
               selective_scan_fused`             (forward only)            initial state's term added in torch)
causal_conv    (the callers' own torch forms)    —                         ``causal_conv1d``: ``causal_conv1d_fn``
                                                                           (widths 2–4)
============== ================================ ========================= ===========================================

All implementations of one operation take the same arguments and return the same thing.
:func:`choose_backend` picks, for a device, a dtype and whether gradients flow
(``grad``): on CUDA the library's kernel when the library imports (each has its own
fused backward); otherwise ``triton`` when triton is installed, the dtype is one the
kernel takes, and either the kernel has its own backward (``linear_scan``) or no gradient
is needed — dynlab's SSD, GLA and selective-scan Triton kernels are forward-only (their
backward would recompute the torch form), so they serve evaluation and never training;
otherwise ``torch``.  The environment variable ``DYNLAB_KERNEL_BACKEND`` (``auto`` by
default, or one of :data:`BACKENDS`) forces one backend where it has the operation
(``triton`` on the CPU needs ``TRITON_INTERPRET=1``; that is how the tests run the kernels).

The short causal convolution of the Mamba mixers is dispatched by :func:`conv_backend`:
its torch forms stay with their callers (:func:`dynlab.lm.models.mixers.causal_conv` for one
model, :func:`kernels.short_conv.causal_conv_silu` for a stack), and on CUDA
``causal_conv1d_fn`` runs it through :func:`causal_conv1d_silu` (same contract as the
one-model form) when causal-conv1d imports and the width is one it takes.

Which backend ran is recorded for provenance: :func:`backends_used` lists, per operation,
every backend :func:`choose_backend` picked in this process, and :func:`record_backends`
collects the same for one block of work (a run).
The ``torch`` backend names the path that runs on any device. On the CPU it calls the C
loops where they are built (the selective scan's here; the LM stacks' GLA recurrence, SSD
and convolution through their own modules), and which of those ran, or why not, is recorded
beside the backend by :func:`kernels.compiled.c_kernels_used`, as a run's provenance shows.

Implementations are imported on first use: triton only when a Triton kernel is picked,
the libraries (mamba-ssm, fla, causal-conv1d) only when CUDA is present, never on the CPU
(their packages need a GPU driver).  A library that is installed but fails to import is
one warning naming it (:func:`library_available`), and its operations take the next
backend.  This module itself imports only torch and :mod:`.compiled`.

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
from typing import Callable

import torch

from .compiled import common_dtype

__all__ = [
    "BACKENDS",
    "ENV_VAR",
    "HAS_TRITON",
    "LIBRARIES",
    "TABLE",
    "backends_used",
    "causal_conv1d_silu",
    "choose_backend",
    "conv_backend",
    "get_kernel",
    "gla",
    "library_available",
    "linear_scan",
    "mamba_ssm_available",
    "needs_grad",
    "record_backends",
    "resolve",
    "selective_scan",
    "ssd",
]

ENV_VAR = "DYNLAB_KERNEL_BACKEND"
BACKENDS = ("torch", "triton", "mamba_ssm", "fla", "causal_conv1d")
HAS_TRITON = importlib.util.find_spec("triton") is not None  # found, not imported: import is lazy

# dtypes each Triton kernel computes in (others take the torch path); the libraries take the same
_COMPLEX_SCAN = {torch.float32, torch.float64, torch.complex64, torch.complex128}
_FLOAT32ISH = {torch.float32, torch.float16, torch.bfloat16}
_TRITON_DTYPES = {"linear_scan": _COMPLEX_SCAN, "ssd": _FLOAT32ISH, "gla": _FLOAT32ISH, "selective_scan": _FLOAT32ISH}
#: dynlab's Triton kernels whose backward recomputes the torch form: evaluation only, never training
TRITON_FORWARD_ONLY = frozenset({"ssd", "gla", "selective_scan"})


def _import_mamba_ssm() -> dict[str, Callable]:
    from mamba_ssm.ops.selective_scan_interface import selective_scan_fn
    from mamba_ssm.ops.triton.ssd_combined import mamba_chunk_scan_combined
    return {"ssd": mamba_chunk_scan_combined, "selective_scan": selective_scan_fn}


def _import_fla() -> dict[str, Callable]:
    from fla.ops.gla import chunk_gla
    return {"gla": chunk_gla}


def _import_causal_conv1d() -> dict[str, Callable]:
    from causal_conv1d import causal_conv1d_fn
    return {"causal_conv": causal_conv1d_fn}


#: backend name -> (distribution name, importer of its operations by dynlab op name)
LIBRARIES: dict[str, tuple[str, Callable[[], dict[str, Callable]]]] = {
    "mamba_ssm": ("mamba-ssm", _import_mamba_ssm),
    "fla": ("fla-core", _import_fla),
    "causal_conv1d": ("causal-conv1d", _import_causal_conv1d),
}
# what each library's import gave: its operations, or {} when it does not import (tried once)
_LIBS: dict[str, dict[str, Callable]] = {}


def library_available(name: str) -> bool:
    """True when library backend ``name`` (a key of :data:`LIBRARIES`) imports; only ever
    tried with CUDA present. A library that is installed but fails to import (an ABI
    mismatch with torch, a missing CUDA extension, a missing dependency) is one warning
    naming the package and the error, once per process; its operations then take the next
    backend. A library that is not installed is silent."""
    if name not in _LIBS:
        _LIBS[name] = {}
        if torch.cuda.is_available():
            package, importer = LIBRARIES[name]
            try:
                _LIBS[name] = importer()
            except ModuleNotFoundError as exc:
                if exc.name is not None and exc.name.split(".")[0] != name:  # installed, a dependency missing
                    _warn_broken(package, exc)
            except Exception as exc:  # noqa: BLE001 - an installed package that fails: said, then not used
                _warn_broken(package, exc)
    return bool(_LIBS[name])


def mamba_ssm_available() -> bool:
    """:func:`library_available` for mamba-ssm."""
    return library_available("mamba_ssm")


def _warn_broken(package: str, exc: BaseException) -> None:
    """One warning: ``package`` is installed but does not import (its kernels are not used)."""
    import warnings

    why = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    warnings.warn(f"{package} is installed but does not import ({why[:200]}); dynlab uses its next backend instead",
                  RuntimeWarning, stacklevel=3)


def _ssd_mamba(x, dt, A, B, C, initial_state=None, return_final_state=False, chunk_size=64):
    """``ssd_chunked``'s contract on ``mamba_chunk_scan_combined`` (B, C with one group per head)."""
    y, final = _LIBS["mamba_ssm"]["ssd"](
        x.contiguous(), dt.contiguous(), A, B.contiguous(), C.contiguous(), chunk_size,
        initial_states=initial_state, return_final_states=True,
    )  # y [B, T, H, P], final [B, H, P, N]
    return (y, final) if return_final_state else y


def _selective_scan_mamba(u, delta, A, B, C, initial_state=None, return_final_state=False, chunk_size=32):
    """``selective_scan_ref``'s contract on ``selective_scan_fn``, which has no initial
    state: the initial state's contribution, exp(Σ_{r≤t} Δ_r A) h0 read out by C_t, is
    added to the zero-state output (and to the final state)."""
    y, last = _LIBS["mamba_ssm"]["selective_scan"](
        u.transpose(1, 2).contiguous(), delta.transpose(1, 2).contiguous(), A.contiguous(),
        B.transpose(1, 2).contiguous(), C.transpose(1, 2).contiguous(), return_last_state=True,
    )  # y [B, D, T], last [B, D, N]
    y = y.transpose(1, 2)  # [B, T, D]
    if initial_state is not None:
        decay = torch.exp(torch.cumsum(delta[..., None] * A, dim=1))  # [B, T, D, N]
        y = y + torch.einsum("btdn,bdn,btn->btd", decay, initial_state, C)
        last = last + decay[:, -1] * initial_state
    return (y, last) if return_final_state else y


def _gla_fla(q, k, v, gk, scale=None, initial_state=None, return_final_state=False, chunk_size=32):
    """``gla_chunked``'s contract on fla's ``chunk_gla`` (the same ``[B, T, H, ·]`` layout and
    ``[B, H, K, V]`` states; fla picks its own chunk size). fla keeps its states in float32:
    the initial state goes in as float32 and the final state comes back in the inputs'
    promoted dtype, as the torch form returns it."""
    o, final = _LIBS["fla"]["gla"](
        q.contiguous(), k.contiguous(), v.contiguous(), gk.contiguous(), scale=scale,
        initial_state=None if initial_state is None else initial_state.float().contiguous(), output_final_state=True,
    )
    final = final.to(common_dtype(q, k, v, gk, initial_state))
    return (o, final) if return_final_state else o


def causal_conv1d_silu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                       window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`dynlab.lm.models.mixers.causal_conv`'s contract on causal-conv1d's ``causal_conv1d_fn``:
    x ``[B, T, C]``, weight ``[C, 1, K]``, bias ``[C]`` or None, window ``[B, C, K − 1]`` or
    None -> (silu(conv) ``[B, T, C]``, the new window ``[B, C, K − 1]``). The kernel reads
    ``x`` in its channel-last layout (a ``[B, T, C]`` tensor seen as ``[B, C, T]``, no copy
    where ``x`` has the standard strides, which its checks read even on dimensions of size 1)
    and takes float32 weights with bfloat16 inputs (the weights and their gradients stay
    float32 under autocast; the bias is cast to the weights' dtype)."""
    b_, t, c = x.shape
    if x.stride() != (t * c, c, 1):
        x = x.clone(memory_format=torch.contiguous_format)
    init = None if window is None else window.to(x.dtype).transpose(1, 2).contiguous().transpose(1, 2)
    w = weight[:, 0, :]
    y, final = _LIBS["causal_conv1d"]["causal_conv"](
        x.transpose(1, 2), w, None if bias is None else bias.to(w.dtype),
        initial_states=init, return_final_states=True, activation="silu",
    )  # y [B, C, T] (channel-last), final [B, C, K - 1]
    return y.transpose(1, 2), final


# "module:function" inside this package, imported on first use (triton only when asked for)
TABLE: dict[str, dict[str, str]] = {
    "linear_scan": {"torch": "scan.chunked:linear_scan", "triton": "scan.triton:linear_scan_triton"},
    "ssd": {"torch": "ssd.chunked:ssd_chunked", "triton": "ssd.triton:ssd_triton", "mamba_ssm": "dispatch:_ssd_mamba"},
    "gla": {"torch": "gla.chunked:gla_chunked", "triton": "gla.triton:gla_triton", "fla": "dispatch:_gla_fla"},
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


def _record(op: str, backend: str) -> str:
    for seen in _USED:
        seen.setdefault(op, set()).add(backend)
    return backend


def forced_backend_problem() -> str | None:
    """Why ``DYNLAB_KERNEL_BACKEND`` forces a backend this machine cannot run — Triton
    without a GPU (unless its interpreter is on, ``TRITON_INTERPRET=1``), a library that
    does not import — in one line, or None (the command line says it as bad input: the
    user's choice, not a failure)."""
    forced = os.environ.get(ENV_VAR, "auto")
    if forced == "triton" and not torch.cuda.is_available() and os.environ.get("TRITON_INTERPRET") != "1":
        return (f"{ENV_VAR}=triton but this machine has no CUDA GPU for Triton's kernels; allowed: auto or torch "
                "here (or TRITON_INTERPRET=1 for Triton's interpreter)")
    if forced in LIBRARIES and not library_available(forced):
        return (f"{ENV_VAR}={forced} but {LIBRARIES[forced][0]} does not import here (it needs a CUDA GPU and the "
                "package); allowed: auto, torch or triton")
    return None


def needs_grad(*tensors: torch.Tensor | None) -> bool:
    """Whether autograd will differentiate through an op on these inputs (grad mode on and
    one of them requires grad): the ``grad`` of :func:`choose_backend`."""
    return torch.is_grad_enabled() and any(t is not None and t.requires_grad for t in tensors)


def choose_backend(op: str, device: torch.device | str, dtype: torch.dtype = torch.float32, grad: bool = False) -> str:
    """Backend name for ``op`` on ``device`` with inputs of ``dtype``, ``grad`` saying whether
    gradients flow through it (see the module docstring); recorded (:func:`backends_used`)."""
    return _record(op, _choose(op, device, dtype, grad))


def _forced() -> str:
    forced = os.environ.get(ENV_VAR, "auto")
    if forced not in ("auto", *BACKENDS):
        raise ValueError(f"{ENV_VAR}={forced!r}; allowed: auto, {', '.join(BACKENDS)}")
    if forced == "triton" and not HAS_TRITON:
        raise RuntimeError(f"{ENV_VAR}=triton but triton is not installed (pip install 'dynlab[triton]')")
    if forced in LIBRARIES and not library_available(forced):
        raise RuntimeError(f"{ENV_VAR}={forced} but {LIBRARIES[forced][0]} does not import here (it needs CUDA)")
    return forced


def _choose(op: str, device: torch.device | str, dtype: torch.dtype, grad: bool) -> str:
    if op not in TABLE:
        raise ValueError(f"unknown operation {op!r}; allowed: {', '.join(TABLE)}")
    forced = _forced()
    if forced != "auto":
        return forced if forced in TABLE[op] else "torch"
    if torch.device(device).type != "cuda" or dtype not in _TRITON_DTYPES[op]:
        return "torch"
    for library in LIBRARIES:
        if library in TABLE[op] and library_available(library):
            return library
    if HAS_TRITON and not (grad and op in TRITON_FORWARD_ONLY):
        return "triton"
    return "torch"


def conv_backend(device: torch.device | str, dtype: torch.dtype, width: int, channels: int) -> str:
    """``"causal_conv1d"`` where :func:`causal_conv1d_silu` runs a Mamba mixer's short
    convolution of ``width`` taps over ``channels`` channels (CUDA, causal-conv1d importing
    or forced by ``DYNLAB_KERNEL_BACKEND=causal_conv1d``, and a shape its channel-last
    kernel takes: width 2–4, channels a multiple of 8, a float dtype), else ``"torch"``
    (the caller's own form); recorded as the operation ``causal_conv``."""
    forced = _forced()
    use = (torch.device(device).type == "cuda" and 2 <= width <= 4 and channels % 8 == 0 and dtype in _FLOAT32ISH
           and (forced == "causal_conv1d" or (forced == "auto" and library_available("causal_conv1d"))))
    return _record("causal_conv", "causal_conv1d" if use else "torch")


def get_kernel(op: str, device: torch.device | str, dtype: torch.dtype = torch.float32, grad: bool = False) -> Callable:
    """The implementation of ``op`` that :func:`choose_backend` picks."""
    return resolve(TABLE[op][choose_backend(op, device, dtype, grad)])


def linear_scan(a: torch.Tensor, b: torch.Tensor, h0: torch.Tensor, chunk: int | None = None) -> torch.Tensor:
    """Diagonal scan h_t = a_t ⊙ h_{t−1} + b_t on the chosen backend (``kernels.scan.linear_scan``'s contract)."""
    return get_kernel("linear_scan", a.device, common_dtype(a, b, h0), needs_grad(a, b, h0))(a, b, h0, chunk)


def ssd(x, dt, A, B, C, initial_state=None, return_final_state=False, chunk_size=64):
    """Mamba-2 SSD on the chosen backend (``kernels.ssd.ssd_chunked``'s contract)."""
    kernel = get_kernel("ssd", x.device, common_dtype(x, dt, A, B, C, initial_state),
                        needs_grad(x, dt, A, B, C, initial_state))
    return kernel(x, dt, A, B, C, initial_state, return_final_state, chunk_size)


def gla(q, k, v, gk, scale=None, initial_state=None, return_final_state=False, chunk_size=32):
    """GLA on the chosen backend (``kernels.gla.gla_chunked``'s contract)."""
    kernel = get_kernel("gla", q.device, common_dtype(q, k, v, gk, initial_state), needs_grad(q, k, v, gk, initial_state))
    return kernel(q, k, v, gk, scale, initial_state, return_final_state, chunk_size)


def selective_scan(u, delta, A, B, C, initial_state=None, return_final_state=False, chunk_size=32):
    """Mamba-1 selective scan on the chosen backend (``selective_scan_ref``'s contract).

    The torch backend is :func:`kernels.selective_scan.selective_scan_fused`: on the CPU a
    small compiled C kernel where a C compiler is available (:mod:`kernels.compiled`), else
    cache-sized torch steps with a hand-written backward (``docs/performance.md`` has the
    measured ratios).
    """
    fn = get_kernel("selective_scan", u.device, common_dtype(u, delta, A, B, C, initial_state),
                    needs_grad(u, delta, A, B, C, initial_state))
    return fn(u, delta, A, B, C, initial_state, return_final_state, chunk_size)
