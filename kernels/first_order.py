"""First derivatives only: the guard on every hand-written backward of the kernels.

A backward written outside autograd (C loops, Triton, in-place torch loops) returns
gradients that carry no graph of their own. Where its gradients would be differentiated
again (``create_graph=True``: a gradient penalty, a Hessian-vector product,
``gradgradcheck``; or a ``torch.func`` transform inside another), it would hand back
gradients whose second-order terms are silently missing. :func:`first_order` turns that into
a clear error, ``"<op>: first derivatives only (create_graph / double backward is not
supported)"``.

The backward runs (without a graph, under ``torch.no_grad``) when its gradients cannot be
differentiated again: in plain autograd, when grad mode is off (``backward()``,
``autograd.grad`` without ``create_graph``); under ``torch.func``, when nothing it reads (the
saved tensors and the incoming gradients) is tracked by anything but the transform running
it. So first derivatives work through ``torch.func.grad`` (also under ``vmap``) and
``torch.func.vjp`` of inputs that need no gradient; the same with inputs that require grad
in plain autograd, ``create_graph=True``, and nested transforms raise. Only the
Functions with a ``setup_context`` (the linear and dense scans, the selective scan) can run
under ``torch.func`` at all; ``jacrev`` stops at in-place writes of their backward passes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

__all__ = ["first_order"]


def _tracked_elsewhere(x: torch.Tensor, own_level: int | None) -> bool:
    """Whether something other than the transform running this backward (level ``own_level``,
    None outside one) differentiates through ``x``: an alive grad-tracking wrapper of another
    level, or plain autograd on the tensor underneath every wrapper."""
    functorch = torch._C._functorch  # torch.func keeps no public view of its wrappers
    while functorch.is_functorch_wrapped_tensor(x):
        level = functorch.maybe_get_level(x)
        if functorch.is_gradtrackingtensor(x) and level is not None and level > 0 and level != own_level:
            return True  # an enclosing grad transform (a dead one, after vjp returns, has level < 0)
        x = functorch.get_unwrapped(x)
    return x.requires_grad


def _differentiated_again(ctx, grads: tuple) -> bool:
    """Whether the gradients of the backward now running may be differentiated again (module
    docstring). In plain autograd that is grad mode on (``create_graph=True``). Under
    torch.func, and when ``torch.func.vjp``'s function replays a backward after its transform
    has returned, it is a saved tensor or an incoming gradient tracked by anything but the
    transform running it."""
    if not torch.is_grad_enabled():
        return False
    try:
        saved = list(ctx.saved_tensors)
    except RuntimeError:  # freed by an earlier backward: the backward itself says so
        saved = []
    tensors = [t for t in (*saved, *grads) if isinstance(t, torch.Tensor)]
    functorch = torch._C._functorch  # torch.func keeps no public view of its transforms
    try:
        active = torch._C._are_functorch_transforms_active()
        if not active and not any(functorch.is_functorch_wrapped_tensor(t) for t in tensors):
            return True  # create_graph=True in plain autograd
        own = None
        if active:
            interpreters = torch._functorch.pyfunctorch.retrieve_all_functorch_interpreters()
            if interpreters and interpreters[-1].key() == functorch.TransformType.Grad:
                own = interpreters[-1].level()
        return any(_tracked_elsewhere(t, own) for t in tensors)
    except AttributeError:  # another torch layout: refuse rather than guess
        return True


def first_order(op: str) -> Callable[[Callable], Callable]:
    """Decorator of an ``autograd.Function``'s ``backward`` (under ``@staticmethod``): raise
    where its gradients may be differentiated again, else run it without a graph (module
    docstring); ``op`` names the public function in the error. The guarded backward carries
    ``first_order = op``, which ``tests/kernels/test_double_backward.py`` checks on every
    Function of the kernels."""

    def mark(backward: Callable) -> Callable:
        @functools.wraps(backward)
        def guarded(ctx, *grads):
            if _differentiated_again(ctx, grads):
                raise RuntimeError(f"{op}: first derivatives only (create_graph / double backward is not supported)")
            with torch.no_grad():  # its gradients are not differentiated: no graph to build
                return backward(ctx, *grads)

        guarded.first_order = op
        return guarded

    return mark
