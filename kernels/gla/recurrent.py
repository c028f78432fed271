"""GLA as its recurrence in C loops, per sequence and head: the LM stacks' GLA layer on the CPU.

``gla_recurrent(q, k, v, gk, scale, initial_state, return_final_state)`` has
:func:`kernels.gla.chunked.gla_ref`'s contract (``q, k, gk [B, T, H, K]``, ``v [B, T, H, V]``,
state ``[B, H, K, V]``)::

    S_t = diag(exp(gk_t)) · S_{t-1} + k_t ⊗ v_t,      o_t = (scale · q_t)ᵀ S_t

Why: at the sizes a 2-core machine trains (a state of ``K × V = 32 × 16`` per head, windows
of 32 steps), :func:`kernels.gla.chunked.gla_chunked` is a few dozen torch ops on small
``[B, Q, Q, H]`` and ``[B, Q, H, K]`` blocks each way (cumulative sums, flips, factored
exponentials, batched GEMMs of 32 × 32 matrices), so a GLA stack spent most of its step
in dispatch and memory traffic.  Here the forward pass walks each ``(sequence, head)`` row
through time with its ``[K, V]`` state in L1, and the backward pass recomputes that row's
states into a ``[T + 1, V, K]`` scratch buffer (transposed, so that its sums over V are
K-wide vectors) and runs the adjoint back through time (``gla.c``, built on first use by
:mod:`kernels.compiled`; about ``2·K·V`` multiply-adds per step and head forward and
``7·K·V`` backward with the recomputation, no stored activations beyond the inputs).

The arithmetic order differs from the chunked form, so the results agree with
:func:`gla_ref` and :func:`gla_chunked` to rounding, not bit for bit
(``tests/kernels/test_gla_recurrent.py``, values and gradients, and ``gradcheck``).
The one-model loop keeps :func:`gla_chunked` (its numbers do not move); the stack
(:mod:`dynlab.lm.train.stack`) calls this where :func:`gla_recurrent_applies`.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch

from ..compiled import as_rows, c_library_status, c_suffix, data_pointer, typed_library
from ..first_order import first_order
from .chunked import gla_chunked, gla_inputs

__all__ = ["c_library", "compiled_kernel_status", "gla_recurrent", "gla_recurrent_applies"]

_C_SOURCE = (Path(__file__).parent / "gla.c").read_text(encoding="utf-8")
_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "dl_gla_fwd_{suf}": ([_I64] * 9 + [ctypes.c_double] + [_PTR] * 7, ctypes.c_int),
    "dl_gla_bwd_{suf}": ([_I64] * 9 + [ctypes.c_double] + [_PTR] * 12, ctypes.c_int),
}


def c_library() -> ctypes.CDLL | None:
    """The GLA recurrence's compiled library (``dl_gla_fwd_*``, ``dl_gla_bwd_*``), or None
    where no C compiler or ``DYNLAB_C_KERNELS=0``."""
    return typed_library("gla", _C_SOURCE, _SIGNATURES)


def compiled_kernel_status() -> str:
    """``"compiled: <path>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or ``"unavailable: <reason>"``
    (then :func:`gla_recurrent` runs :func:`gla_chunked`)."""
    return c_library_status("gla", _C_SOURCE)


def gla_recurrent_applies(q: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """Whether :func:`gla_recurrent` runs the C loops for these tensors: CPU, float32 or
    float64, one dtype, and the library available."""
    return (q.device.type == "cpu" and c_suffix(q.dtype) is not None
            and all(o is None or (o.dtype == q.dtype and o.device.type == "cpu") for o in others)
            and c_library() is not None)


def gla_recurrent(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, gk: torch.Tensor, scale: float | None = None,
                  initial_state: torch.Tensor | None = None, return_final_state: bool = False,
                  chunk_size: int = 32) -> torch.Tensor | tuple[torch.Tensor, torch.Tensor]:
    """:func:`kernels.gla.chunked.gla_ref`'s function and contract (module docstring): the C
    loops where :func:`gla_recurrent_applies`, else :func:`gla_chunked` (with ``chunk_size``,
    which the recurrence does not use)."""
    q, k, v, gk, initial_state = gla_inputs(q, k, v, gk, initial_state)  # mixed dtypes: promoted
    b, t, h, dk = q.shape
    dv = v.shape[-1]
    if initial_state is not None and tuple(initial_state.shape) != (b, h, dk, dv):
        raise ValueError(f"gla_recurrent: initial_state must be [B, H, K, V] = {(b, h, dk, dv)}, "
                         f"got {tuple(initial_state.shape)}")
    scale = dk ** -0.5 if scale is None else float(scale)
    if t == 0 or not gla_recurrent_applies(q, k, v, gk, initial_state):
        return gla_chunked(q, k, v, gk, scale, initial_state, return_final_state, chunk_size)
    rows = [as_rows(x.reshape(b, t, x.shape[2] * x.shape[3])) for x in (q, k, v, gk)]  # read in place where x is a slice
    o, final = _gla_c(*(r[0] for r in rows), None if initial_state is None else initial_state.contiguous(), scale,
                      (h, dk, dv, *(r[1] for r in rows)))
    o = o.view(b, t, h, dv)
    return (o, final) if return_final_state else o


@torch.compiler.disable  # torch.compile runs the C loops as they are (it cannot trace a ctypes call)
def _gla_c(q, k, v, gk, h0, scale, sizes):
    return _GLARecurrentC.apply(q, k, v, gk, h0, scale, sizes)


class _GLARecurrentC(torch.autograd.Function):
    """Forward: each (sequence, head) row's state stepped through time; backward: the row's
    states recomputed, then the adjoint stepped back (``gla.c``)."""

    @staticmethod
    def forward(ctx, q, k, v, gk, h0, scale, sizes):
        b, t = q.shape[:2]
        h, dk, dv, *lds = sizes
        o = torch.empty(b, t, h * dv, dtype=q.dtype)
        final = torch.empty(b, h, dk, dv, dtype=q.dtype)
        fn = getattr(c_library(), f"dl_gla_fwd_{c_suffix(q.dtype)}")
        if fn(b, t, h, dk, dv, *lds, scale, *map(data_pointer, (q, k, v, gk, h0, o, final))):
            raise MemoryError(f"GLA recurrence: out of memory for a [{dk}, {dv}] state")
        ctx.save_for_backward(q, k, v, gk, h0)
        ctx.scale, ctx.sizes = scale, sizes
        ctx.set_materialize_grads(False)  # an unused output: a null gradient
        return o, final

    @staticmethod
    @first_order("gla_recurrent")
    def backward(ctx, grad_o, grad_final):
        q, k, v, gk, h0 = ctx.saved_tensors
        if grad_o is None and grad_final is None:
            return None, None, None, None, None, None, None
        b, t = q.shape[:2]
        h, dk, dv, *lds = ctx.sizes
        go = q.new_zeros(b, t, h * dv) if grad_o is None else grad_o.contiguous()
        gf = None if grad_final is None else grad_final.contiguous()
        gq, gk_, ggk = (q.new_empty(b, t, h * dk) for _ in range(3))
        gv = q.new_empty(b, t, h * dv)
        gh0 = q.new_empty(b, h, dk, dv)
        fn = getattr(c_library(), f"dl_gla_bwd_{c_suffix(q.dtype)}")
        if fn(b, t, h, dk, dv, *lds, ctx.scale, *map(data_pointer, (q, k, v, gk, h0, go, gf, gq, gk_, gv, ggk, gh0))):
            raise MemoryError(f"GLA recurrence backward: out of memory for [{t + 1}, {dk}, {dv}] states")
        return gq, gk_, gv, ggk, (gh0 if ctx.needs_input_grad[4] else None), None, None
