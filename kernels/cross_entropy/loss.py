"""Per-token cross-entropy (``F.cross_entropy(..., reduction="none")``) as one op with a
hand-written backward.

``token_nll(logits [N, V], targets [N])`` is ``logsumexp(logits_i) − logits_i[target_i]``
per row.  Through autograd a small LM's loss costs a ``log_softmax`` pass, and in the
backward pass a zero-filled ``[N, V]`` gradient (``nll_loss``'s), a scatter and
``log_softmax``'s backward: on a stack of 16 budget-size LMs that was about a fifth of a
training step.  The C loops (``cross_entropy.c``, built on first use by
:mod:`kernels.compiled`) read each row once forward (keeping only its max and log-sum of exponentials) and
write its gradient ``(softmax − onehot) · g`` in one pass backward.  Without them (no
compiler, ``DYNLAB_C_KERNELS=0``, other devices or dtypes) the op is
:func:`token_nll_ref`, ``F.cross_entropy`` itself.  The C loop's float32 exp is its own
(about 1 ulp), so it agrees with the reference to rounding (``tests/kernels/test_cross_entropy.py``).
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from ..compiled import c_library_status, c_suffix, typed_library
from ..first_order import first_order

__all__ = ["compiled_kernel_status", "probs_grad_", "probs_nll_", "token_nll", "token_nll_ref"]


def token_nll_ref(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The reference: ``F.cross_entropy(logits [N, V], targets [N], reduction="none")`` -> ``[N]``."""
    return F.cross_entropy(logits, targets, reduction="none")


def token_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """:func:`token_nll_ref`'s function: the C loops for float32/float64 CPU logits when they
    are available (module docstring; targets must lie in ``[0, V)``), else the reference."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"token_nll: need logits [N, V] and targets [N]; got {tuple(logits.shape)}, {tuple(targets.shape)}")
    if _c_applies(logits):
        t = targets.to(torch.int64).contiguous()
        if t.numel() and not (0 <= int(t.min()) and int(t.max()) < logits.shape[1]):
            raise ValueError(f"token_nll: targets must lie in [0, {logits.shape[1]})")
        return _token_nll_c(logits.contiguous(), t)
    return token_nll_ref(logits, targets)


def probs_nll_(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """No autograd, in place: contiguous logits ``[N, V]`` (int64 targets ``[N]`` in ``[0, V)``)
    are overwritten with their softmax; returns ``(nll [N], logsumexp [N])``.  The C loops
    where :func:`token_nll` would run them, else torch."""
    if _c_applies(logits):
        nll, lse = logits.new_empty(logits.shape[0]), logits.new_empty(logits.shape[0])
        getattr(_c_library(), f"dl_ce_probs_{c_suffix(logits.dtype)}")(
            *logits.shape, logits.data_ptr(), targets.data_ptr(), nll.data_ptr(), lse.data_ptr())
        return nll, lse
    m = logits.amax(dim=1)
    target_logit = logits.gather(1, targets[:, None])[:, 0]
    total = logits.sub_(m[:, None]).exp_().sum(dim=1)
    logits.div_(total[:, None])
    log_total = total.log()
    return (m - target_logit) + log_total, m + log_total  # m and log_total apart (cross_entropy.c)


def probs_grad_(probs: torch.Tensor, targets: torch.Tensor, grad_nll: torch.Tensor) -> torch.Tensor:
    """No autograd, in place: :func:`probs_nll_`'s probabilities ``[N, V]`` become the logits'
    gradient ``(softmax − onehot) · grad_nll`` (grad_nll contiguous ``[N]``); returns them."""
    if _c_applies(probs):
        getattr(_c_library(), f"dl_ce_probs_grad_{c_suffix(probs.dtype)}")(
            *probs.shape, probs.data_ptr(), targets.data_ptr(), grad_nll.data_ptr())
        return probs
    probs.scatter_add_(1, targets[:, None], torch.full_like(grad_nll[:, None], -1.0))
    return probs.mul_(grad_nll[:, None])


def _c_applies(logits: torch.Tensor) -> bool:
    return (logits.device.type == "cpu" and c_suffix(logits.dtype) is not None and logits.shape[1] > 0
            and _c_library() is not None)


#: The C source of the loops, shipped beside this module (built by :mod:`dynlab.kernels.compiled`).
_C_SOURCE = (Path(__file__).parent / "cross_entropy.c").read_text(encoding="utf-8")



def compiled_kernel_status() -> str:
    """``"compiled: <path>"``, ``"disabled: DYNLAB_C_KERNELS=0"`` or ``"unavailable: <reason>"``
    (then :func:`token_nll` runs the reference)."""
    return c_library_status("cross_entropy", _C_SOURCE)


_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "dl_ce_fwd_{suf}": ([_I64] * 2 + [_PTR] * 5, None),
    "dl_ce_bwd_{suf}": ([_I64] * 2 + [_PTR] * 6, None),
    "dl_ce_probs_{suf}": ([_I64] * 2 + [_PTR] * 4, None),
    "dl_ce_probs_grad_{suf}": ([_I64] * 2 + [_PTR] * 3, None),
}


def _c_library() -> ctypes.CDLL | None:
    return typed_library("cross_entropy", _C_SOURCE, _SIGNATURES)


@torch.compiler.disable  # torch.compile runs the C loops as they are (it cannot trace a ctypes call)
def _token_nll_c(logits, targets):
    return _TokenNllC.apply(logits, targets)


class _TokenNllC(torch.autograd.Function):
    """The compiled loops: forward keeps each row's max and log-sum of exponentials, backward
    writes ``(softmax − onehot)·g``."""

    @staticmethod
    def forward(ctx, logits, targets):
        n, v = logits.shape
        nll, row_max, log_total = logits.new_empty(n), logits.new_empty(n), logits.new_empty(n)
        getattr(_c_library(), f"dl_ce_fwd_{c_suffix(logits.dtype)}")(
            n, v, logits.data_ptr(), targets.data_ptr(), nll.data_ptr(), row_max.data_ptr(), log_total.data_ptr())
        ctx.save_for_backward(logits, targets, row_max, log_total)
        ctx.mark_non_differentiable(targets)
        return nll

    @staticmethod
    @first_order("token_nll")
    def backward(ctx, grad_nll):
        logits, targets, row_max, log_total = ctx.saved_tensors
        n, v = logits.shape
        g = grad_nll.contiguous()
        gx = torch.empty_like(logits)
        getattr(_c_library(), f"dl_ce_bwd_{c_suffix(logits.dtype)}")(
            n, v, logits.data_ptr(), targets.data_ptr(), row_max.data_ptr(), log_total.data_ptr(), g.data_ptr(),
            gx.data_ptr())
        return gx, None
