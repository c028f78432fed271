"""The LM head and its per-token cross-entropy as one op, per member of a stack.

``head_nll(x [E, N, D], w [E, V, D], targets [E, N])`` is, per member ``e`` and token ``i``,
``logsumexp(x[e, i] @ w[e].T) − (x[e, i] @ w[e].T)[targets[e, i]]``.  Written as a linear
layer and then :func:`kernels.cross_entropy.token_nll`, the loss takes the exponential of
every logit twice (forward for the log-sum-exp, backward for the softmax), which is most of
its cost on a CPU (V = 256 bytes, much wider than a small model), and allocates a fresh
``[E, N, V]`` gradient.  Here the logits are the op's own, so:

- forward: one batched GEMM, then each row of logits is overwritten with its softmax while
  its log-sum-exp and target logit are taken (:func:`kernels.cross_entropy.probs_nll_`,
  the C loops of ``cross_entropy.c`` where they apply); the probabilities are kept;
- backward: the probabilities become ``(softmax − onehot) · g`` in place
  (:func:`kernels.cross_entropy.probs_grad_`; no exponential), then ``dx`` and ``dw`` are
  two batched GEMMs (a second backward through the same graph recomputes the softmax).

:func:`head_nll_ref` is the reference through autograd (the batched GEMM and
``F.cross_entropy``); the results agree with it to rounding (``tests/kernels/test_head_nll.py``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..first_order import first_order
from .loss import probs_grad_, probs_nll_

__all__ = ["head_nll", "head_nll_ref"]

def _check(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> None:
    if x.dim() != 3 or w.dim() != 3 or w.shape[0] != x.shape[0] or w.shape[2] != x.shape[2] \
            or targets.shape != x.shape[:2]:
        raise ValueError(f"head_nll: need x [E, N, D], w [E, V, D] and targets [E, N]; got {tuple(x.shape)}, "
                         f"{tuple(w.shape)}, {tuple(targets.shape)}")


def head_nll_ref(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The reference through autograd: ``F.cross_entropy(x[e] @ w[e].T, targets[e])`` per
    token -> ``[E, N]`` (x ``[E, N, D]``, w ``[E, V, D]``, targets ``[E, N]``)."""
    _check(x, w, targets)
    logits = torch.bmm(x, w.transpose(1, 2))
    return F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none").view(targets.shape)


def head_nll(x: torch.Tensor, w: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """:func:`head_nll_ref`'s function (module docstring).  w is cast to x's dtype; targets
    must lie in ``[0, V)``."""
    _check(x, w, targets)
    t = targets.to(torch.int64).contiguous()
    if t.numel() and not (0 <= int(t.min()) and int(t.max()) < w.shape[1]):
        raise ValueError(f"head_nll: targets must lie in [0, {w.shape[1]})")
    return _head_nll(x, w.to(x.dtype), t)


@torch.compiler.disable  # torch.compile runs the op as it is (the C loops are ctypes calls)
def _head_nll(x, w, targets):
    return _HeadNll.apply(x, w, targets)


class _HeadNll(torch.autograd.Function):
    """Forward keeps the softmax; backward turns it into the logits' gradient in place."""

    @staticmethod
    def forward(ctx, x, w, targets):
        e, n, _ = x.shape
        probs = torch.bmm(x, w.transpose(1, 2))  # [E, N, V], the logits until probs_nll_
        nll, _ = probs_nll_(probs.view(e * n, w.shape[1]), targets.view(-1))
        ctx.save_for_backward(x, w, targets)
        ctx.mark_non_differentiable(targets)
        ctx.probs = probs  # an intermediate of this op alone, overwritten by the first backward
        return nll.view(e, n)

    @staticmethod
    @first_order("head_nll")
    def backward(ctx, grad_nll):
        x, w, targets = ctx.saved_tensors
        e, n, _ = x.shape
        probs, ctx.probs = ctx.probs, None
        if probs is None:  # a second backward (retain_graph): the softmax again, from the inputs
            probs = torch.bmm(x, w.transpose(1, 2))
            probs_nll_(probs.view(e * n, w.shape[1]), targets.view(-1))
        gl = probs_grad_(probs.view(e * n, w.shape[1]), targets.view(-1),
                         grad_nll.contiguous().view(-1)).view(probs.shape)
        gx = torch.bmm(gl, w) if ctx.needs_input_grad[0] else None
        gw = torch.bmm(x.transpose(1, 2), gl).transpose(1, 2) if ctx.needs_input_grad[1] else None
        return gx, gw, None
