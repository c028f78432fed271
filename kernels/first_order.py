"""First derivatives only: the guard on every hand-written backward of the kernels.

A backward written outside autograd (C loops, Triton, in-place torch loops) returns
gradients that carry no graph of their own. Asked to build one (``create_graph=True``: a
gradient penalty, a Hessian-vector product, ``gradgradcheck``), it would hand back gradients
whose second-order terms are silently missing. :func:`first_order` turns that into a clear
error, ``"<op>: first derivatives only (create_graph / double backward is not supported)"``:

- under ``create_graph=True`` the backward raises at once;
- under ``torch.func`` (only the Functions with a ``setup_context`` run there: the linear
  and dense scans and the selective scan) one level of differentiation runs (``grad``,
  ``vjp``, ``jacrev``, each under ``vmap`` too), and a backward whose gradients an enclosing
  transform would differentiate again (``grad(grad(f))``, ``jacrev(jacrev(f))``) raises.
  ``torch.func.vjp`` outside any other transform builds the graph as ``create_graph=True``
  does, and raises like it.

A backward that may run always runs without a graph (``torch.no_grad``), as in a plain
``loss.backward()``; so one level of ``torch.func`` works also where the backward writes
into its buffers in place.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch

__all__ = ["first_order"]


def _differentiated_again() -> bool:
    """Whether the gradients of the backward now running would be differentiated again.

    Outside torch.func: whether grad mode is on (``create_graph=True``). Inside, the stack of
    active transforms decides: the innermost ``Grad`` level is the one running this backward
    (``grad``, ``vmap(grad)``; ``vjp`` and ``jacrev`` run theirs after leaving it), and any
    other ``Grad`` or ``Jvp`` level would differentiate its output."""
    if not torch.is_grad_enabled():
        return False
    if not torch._C._are_functorch_transforms_active():
        return True
    # torch.func has no public view of its transform stack; read it where torch keeps it
    stack = getattr(getattr(torch._functorch, "pyfunctorch", None), "retrieve_all_functorch_interpreters", None)
    kinds = getattr(torch._C._functorch, "TransformType", None)
    if stack is None or kinds is None:  # another torch layout: let torch.func decide
        return False
    keys = [i.key() for i in stack()]
    differentiating = sum(k in (kinds.Grad, kinds.Jvp) for k in keys)
    own = 1 if keys and keys[-1] == kinds.Grad else 0
    return differentiating - own > 0


def first_order(op: str) -> Callable[[Callable], Callable]:
    """Decorator of an ``autograd.Function``'s ``backward`` (under ``@staticmethod``): raise
    where its gradients would be differentiated again (module docstring); ``op`` names the
    public function in the error. The guarded backward carries ``first_order = op``, which
    ``tests/kernels/test_double_backward.py`` checks on every Function of the kernels."""

    def mark(backward: Callable) -> Callable:
        @functools.wraps(backward)
        def guarded(ctx, *grads):
            if _differentiated_again():
                raise RuntimeError(f"{op}: first derivatives only (create_graph / double backward is not supported)")
            with torch.no_grad():  # its gradients are not differentiated: no graph to build
                return backward(ctx, *grads)

        guarded.first_order = op
        return guarded

    return mark
