"""AdamW over a stack of E models' flat parameters, with each member's gradient clipping
folded in, as one pass.

``adamw_step_(p, grad, m1, m2, coef, alive, lr, decay, step, betas, eps)`` updates ``p``,
``m1`` and ``m2`` ``[E, P]`` in place from the gradient ``grad [E, P]``, per member ``e``::

    g  = grad[e] · coef[e]  if alive[e]  else 0        (clipping: coef = min(1, clip / norm))
    m1 = lerp(m1, g, 1 − β1),   m2 = β2·m2 + (1 − β2)·g²
    p  = p · (1 − lr·decay·alive[e]) − (lr / (1 − β1^step)) · m1·alive[e] / (√m2 / √(1 − β2^step) + eps)

— torch's AdamW (decoupled weight decay ``decay [P]``, bias-corrected moments) on every
member at once; a member with ``alive[e] = 0`` keeps its parameters exactly.
:func:`adamw_step_ref` is that update as torch ops, a dozen passes over the ``[E, P]``
stack; for float32/float64 CPU tensors two C loops (``adamw.c``, built on first use by
:mod:`kernels.compiled`) update the moments in one pass and the parameters in another,
around torch's own ``sqrt`` (which need not be correctly rounded), with the same
operations in the same order, fused multiply-adds exactly where torch's vectorised loops
fuse them (``lerp_``, ``addcmul_``): bit for bit the torch form where torch's CPU loops use
FMA (x86 with AVX2 or newer; ``tests/kernels/test_adamw.py``).  Without a C compiler or
with ``DYNLAB_C_KERNELS=0`` the reference runs.
"""

from __future__ import annotations

import ctypes
import math
from pathlib import Path

import torch

from ..compiled import c_library_status, c_suffix, typed_library

__all__ = ["adamw_step_", "adamw_step_ref", "c_library", "compiled_kernel_status"]


@torch.no_grad()
def adamw_step_ref(p: torch.Tensor, grad: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, coef: torch.Tensor,
                   alive: torch.Tensor, lr: float, decay: torch.Tensor, step: int, betas: tuple[float, float],
                   eps: float) -> None:
    """The update as torch ops (module docstring): p, grad, m1, m2 ``[E, P]``; coef ``[E]``;
    alive ``[E]`` bool; decay ``[P]``; step counts from 1."""
    b1, b2 = betas
    g = torch.where(alive[:, None], grad * coef[:, None], 0.0)
    live = alive[:, None].to(p.dtype)
    m1.lerp_(g, 1 - b1)
    m2.mul_(b2).addcmul_(g, g, value=1 - b2)
    bc1 = 1 - b1 ** step
    denom = (m2.sqrt() / math.sqrt(1 - b2 ** step)).add_(eps)
    p.mul_(1 - lr * decay * live)  # decay [P] x alive [E, 1]: frozen members are multiplied by 1
    p.addcdiv_(m1 * live, denom, value=-lr / bc1)


@torch.no_grad()
def adamw_step_(p: torch.Tensor, grad: torch.Tensor, m1: torch.Tensor, m2: torch.Tensor, coef: torch.Tensor,
                alive: torch.Tensor, lr: float, decay: torch.Tensor, step: int, betas: tuple[float, float],
                eps: float) -> None:
    """:func:`adamw_step_ref`'s update, in one C pass where it applies (module docstring)."""
    e, n = p.shape
    if (p.device.type == "cpu" and c_suffix(p.dtype) is not None
            and all(t.dtype == p.dtype for t in (grad, m1, m2, coef, decay))
            and all(t.is_contiguous() for t in (p, grad, m1, m2, coef, decay)) and grad.shape == m1.shape == m2.shape == p.shape
            and coef.shape == alive.shape == (e,) and decay.shape == (n,) and c_library() is not None):
        b1, b2 = betas
        lib, suf = c_library(), c_suffix(p.dtype)
        live = alive.to(p.dtype).contiguous()
        getattr(lib, f"dl_adamw_moments_{suf}")(e, n, *(t.data_ptr() for t in (grad, m1, m2, coef, live)), 1 - b1, b2, 1 - b2)
        root = m2.sqrt()  # torch's own square root (not always correctly rounded), as in the torch form
        getattr(lib, f"dl_adamw_params_{suf}")(e, n, *(t.data_ptr() for t in (p, m1, root, live, decay)), lr,
                                               -lr / (1 - b1 ** step), math.sqrt(1 - b2 ** step), eps)
        return
    adamw_step_ref(p, grad, m1, m2, coef, alive, lr, decay, step, betas, eps)


#: The C source of the loop, shipped beside this module (built by :mod:`dynlab.kernels.compiled`).
_C_SOURCE = (Path(__file__).parent / "adamw.c").read_text(encoding="utf-8")


_I64, _PTR, _F64 = ctypes.c_int64, ctypes.c_void_p, ctypes.c_double
_SIGNATURES = {"dl_adamw_moments_{suf}": ([_I64] * 2 + [_PTR] * 5 + [_F64] * 3, ctypes.c_int),
               "dl_adamw_params_{suf}": ([_I64] * 2 + [_PTR] * 5 + [_F64] * 4, ctypes.c_int)}


def c_library() -> ctypes.CDLL | None:
    """The loops' compiled library (``dl_adamw_moments_*``, ``dl_adamw_params_*``), or None where no C compiler or ``DYNLAB_C_KERNELS=0``."""
    return typed_library("adamw", _C_SOURCE, _SIGNATURES)


def compiled_kernel_status() -> str:
    """``"compiled: <path>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or ``"unavailable: <reason>"``
    (then :func:`adamw_step_` runs the reference)."""
    return c_library_status("adamw", _C_SOURCE)
