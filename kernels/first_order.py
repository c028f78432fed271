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
``autograd.grad`` without ``create_graph``) and no forward-mode tangent rides on the
incoming gradients; under ``torch.func``, when nothing it reads (the saved tensors and the
incoming gradients) is tracked by anything but the grad level it belongs to. So first
derivatives work through one ``torch.func.grad`` (also of a function that calls ``vmap``)
and through ``torch.func.vjp`` of inputs that need no gradient. ``torch.func.grad`` of inputs
that plain autograd tracks (outside ``torch.no_grad``), ``create_graph=True``, a ``vjp``
function differentiated again, and nested transforms raise. Only the Functions with a
``setup_context`` (the linear and dense scans, the selective scan) can run under
``torch.func`` at all, and only their torch forms (the C loops need real storage);
``jacrev`` and ``vmap(grad)`` stop at the in-place writes of their backward passes.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

__all__ = ["first_order"]


def _wrappers(x: torch.Tensor) -> tuple[list[int], torch.Tensor]:
    """The levels of ``x``'s grad-tracking torch.func wrappers, outermost first (a dead one,
    whose transform has returned, has a level below 1), and the tensor underneath them all."""
    functorch = torch._C._functorch  # torch.func keeps no public view of its wrappers
    levels = []
    while functorch.is_functorch_wrapped_tensor(x):
        if functorch.is_gradtrackingtensor(x):
            levels.append(functorch.maybe_get_level(x))
        x = functorch.get_unwrapped(x)
    return levels, x


def _level0_records() -> bool:
    """Whether plain autograd (level 0, under every transform) records now: the grad mode the
    outermost torch.func grad transform found on entry, else the current one."""
    if torch._C._are_functorch_transforms_active():
        interpreters = torch._functorch.pyfunctorch.retrieve_all_functorch_interpreters()
        if interpreters and interpreters[0].key() == torch._C._functorch.TransformType.Grad:
            return bool(interpreters[0].prev_grad_mode())
    return True  # grad mode is on here (create_graph, or a transform that does not change it)


def _differentiated_again(ctx, grads: tuple) -> bool:
    """Whether the gradients of the backward now running may be differentiated again (module
    docstring). Forward-mode tangents on the incoming gradients: always. Otherwise grad mode
    must be on, and then, in plain autograd, that is ``create_graph=True``; under torch.func
    (or a ``torch.func.vjp`` function replayed after its transform returned), it is a saved
    tensor or an incoming gradient tracked by another grad level than the one this backward
    belongs to (the level of the saved tensors' outermost wrapper, none where it is dead),
    or by plain autograd underneath."""
    if any(isinstance(g, torch.Tensor) and torch.autograd.forward_ad.unpack_dual(g).tangent is not None
           for g in grads):
        return True  # a forward-mode tangent would be dropped by the hand-written backward
    if not torch.is_grad_enabled():
        return False
    try:
        saved = list(ctx.saved_tensors)
    except RuntimeError:  # freed by an earlier backward: the backward itself says so
        saved = []
    try:
        peeled = [(_wrappers(t), i < len(saved))
                  for i, t in enumerate((*saved, *grads)) if isinstance(t, torch.Tensor)]
        if not torch._C._are_functorch_transforms_active() and not any(levels for (levels, _), _ in peeled):
            return True  # create_graph=True in plain autograd
        own = next((levels[0] for (levels, _), is_saved in peeled if is_saved and levels), None)
        own = own if own is not None and own > 0 else None  # a dead level: a vjp function replayed
        records = _level0_records()
        return any(any(lv > 0 and lv != own for lv in levels) or (records and base.requires_grad)
                   for (levels, base), _ in peeled)
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
