"""Second derivatives through the kernels' hand-written backward passes are refused with a
clear error, never computed silently wrong.

A hand-written backward computes its gradients outside autograd (C loops, Triton, in-place
torch loops), so with ``create_graph=True`` they would carry no graph: a gradient penalty or
a Hessian-vector product would lose their terms without a word. Every ``autograd.Function``
of ``dynlab.kernels`` guards its backward with :func:`dynlab.kernels.first_order.first_order`:
where its gradients may be differentiated again (``create_graph=True``, nested
``torch.func`` transforms, ``torch.func.grad`` of a tensor plain autograd tracks) it raises; one level of ``torch.func.grad`` or ``vjp`` gives exact first derivatives."""

from __future__ import annotations

import importlib
import inspect
import pkgutil
import warnings

import pytest
import torch

import dynlab.kernels as kernels_pkg
from dynlab.kernels.compiled import C_KERNELS_ENV
from dynlab.kernels.cross_entropy import head_nll, token_nll
from dynlab.kernels.gated_norm import gated_rms_norm
from dynlab.kernels.gated_norm import norm as gn
from dynlab.kernels.scan import linear_scan, linear_scan_ref
from dynlab.kernels.short_conv import causal_conv_silu
from dynlab.kernels.short_conv import conv as sc

def _kernel_functions() -> list[type]:
    """Every autograd.Function subclass defined in a module of dynlab.kernels (Triton's
    modules where Triton is installed)."""
    found = {}
    for info in pkgutil.walk_packages(kernels_pkg.__path__, kernels_pkg.__name__ + "."):
        try:
            module = importlib.import_module(info.name)
        except ImportError:  # the Triton modules without Triton
            continue
        for _, cls in inspect.getmembers(module, inspect.isclass):
            if issubclass(cls, torch.autograd.Function) and cls.__module__ == module.__name__:
                found[cls.__qualname__ + "@" + cls.__module__] = cls
    return list(found.values())


def test_every_kernel_function_refuses_second_derivatives():
    functions = _kernel_functions()
    names = {f.__name__ for f in functions}
    # the walk found the kernels (a broken walk would pass vacuously)
    assert {"_ConvSiluC", "_ConvSiluTorch", "_GatedNormC", "_Mamba2InnerC", "_SSDSingleChunkC",
            "_HeadNll", "_TokenNllC", "_LinearScan", "_DenseRNN"} <= names
    unguarded = [f.__name__ for f in functions if getattr(f.backward, "first_order", None) is None]
    assert unguarded == [], f"backward without the first_order guard: {unguarded}"


def _assert_refuses_double_backward(fn, inputs, op):
    """create_graph=True raises a one-line error naming the op, with or without a first-order
    term beside it (where once_differentiable alone would drop the penalty's terms silently)."""
    with pytest.raises(RuntimeError, match=f"^{op}: first derivatives only"):
        torch.autograd.grad(fn(*inputs).square().sum(), inputs, create_graph=True)
    with pytest.raises(RuntimeError, match=f"^{op}: first derivatives only"):
        out = fn(*inputs).square().sum()
        grads = torch.autograd.grad(out, inputs, create_graph=True)
        torch.autograd.grad(out + sum(g.square().sum() for g in grads), inputs)
    # first derivatives are unaffected by the guard
    assert all(g is not None for g in torch.autograd.grad(fn(*inputs).square().sum(), inputs))


@pytest.mark.parametrize("c_kernels", ["1", "0"], ids=["c-kernel", "torch-form"])
def test_short_convolution_refuses_second_derivatives(c_kernels, monkeypatch):
    monkeypatch.setenv(C_KERNELS_ENV, c_kernels)
    if c_kernels == "1" and sc.c_library() is None:
        pytest.skip(f"compiled short conv {sc.compiled_kernel_status()}")
    g = torch.Generator().manual_seed(0)
    x, w, b = (torch.randn(*s, generator=g, dtype=torch.float64, requires_grad=True)
               for s in ((2, 3, 6, 5), (2, 4, 5), (2, 5)))
    _assert_refuses_double_backward(lambda x, w, b: causal_conv_silu(x, w, b, None), (x, w, b), "causal_conv_silu")


def test_gated_norm_and_loss_refuse_second_derivatives():
    if gn.c_library() is None:
        pytest.skip(f"compiled gated norm {gn.compiled_kernel_status()}")
    g = torch.Generator().manual_seed(1)
    y, z = (torch.randn(2, 3, 4, 8, generator=g, dtype=torch.float64, requires_grad=True) for _ in range(2))
    w = torch.randn(2, 8, generator=g, dtype=torch.float64, requires_grad=True)
    _assert_refuses_double_backward(lambda y, z, w: gated_rms_norm(y, z, w, 1e-6), (y, z, w), "gated_rms_norm")
    logits = torch.randn(7, 11, generator=g, dtype=torch.float64, requires_grad=True)
    targets = torch.randint(0, 11, (7,), generator=g)
    _assert_refuses_double_backward(lambda v: token_nll(v, targets), (logits,), "token_nll")


def test_torch_func_through_a_guarded_kernel_is_exact_and_refuses_a_second_order():
    """One level of torch.func runs the hand-written backward (its gradient equals the
    autograd reference's); a second level, or plain autograd tracking the input underneath
    (a gradient penalty on torch.func.grad's result), raises."""
    g = torch.Generator().manual_seed(2)
    a = torch.rand(2, 5, 3, generator=g, dtype=torch.float64) * 0.9
    h0, b = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((2, 3), (2, 5, 3)))
    loss = lambda scan: (lambda v: scan(a * v.sigmoid(), v, h0).square().sum())  # noqa: E731
    torch.testing.assert_close(torch.func.grad(loss(linear_scan))(b), torch.func.grad(loss(linear_scan_ref))(b),
                               rtol=1e-12, atol=1e-12)
    vjps = [torch.func.vjp(lambda v: scan(a, v, h0), b) for scan in (linear_scan, linear_scan_ref)]
    got, want = (fn(torch.ones_like(out))[0] for out, fn in vjps)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)
    with pytest.raises(RuntimeError, match="^linear_scan: first derivatives only"):
        torch.func.grad(lambda v: torch.func.grad(loss(linear_scan))(v).sum())(b)
    with pytest.raises(RuntimeError, match="^linear_scan: first derivatives only"):
        tracked = b.clone().requires_grad_()
        torch.autograd.grad(torch.func.grad(loss(linear_scan))(tracked).square().sum(), tracked)


def test_a_vjp_function_differentiated_again_raises_and_no_grad_does_not():
    """A torch.func.vjp function replayed inside another grad (the meta-learning pattern)
    raises, where its gradient came out zero before; a grad under no_grad, over a closure
    that holds a tensor plain autograd would track, runs and equals the reference."""
    g = torch.Generator().manual_seed(4)
    a = torch.rand(2, 5, 3, generator=g, dtype=torch.float64) * 0.9
    h0, b, ct = (torch.randn(*s, generator=g, dtype=torch.float64) for s in ((2, 3), (2, 5, 3), (2, 5, 3)))
    with pytest.raises(RuntimeError, match="^linear_scan: first derivatives only"):
        torch.func.grad(lambda aa: torch.func.vjp(lambda v: linear_scan(aa, v, h0), b)[1](ct)[0].square().sum())(a)
    _, replay = torch.func.vjp(lambda v: linear_scan(a, v, h0), b)
    with pytest.raises(RuntimeError, match="^linear_scan: first derivatives only"):
        torch.func.grad(lambda c: replay(c)[0].square().sum())(ct)
    tracked = a.clone().requires_grad_()  # a parameter, say
    with torch.no_grad():
        got = torch.func.grad(lambda v: linear_scan(tracked, v, h0).square().sum())(b)
        want = torch.func.grad(lambda v: linear_scan_ref(tracked, v, h0).square().sum())(b)
    torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-12)


def test_a_forward_mode_tangent_on_the_incoming_gradient_raises():
    """A dual tensor given as grad_outputs would lose its tangent in a hand-written backward."""
    from torch.autograd import forward_ad

    g = torch.Generator().manual_seed(5)
    x = torch.randn(2, 6, 4, generator=g, dtype=torch.float64, requires_grad=True)
    w = torch.randn(2, 7, 4, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 7, (2, 6), generator=g)
    nll = head_nll(x, w, targets)
    tangent = torch.randn(nll.shape, generator=g, dtype=torch.float64)
    with forward_ad.dual_level(), warnings.catch_warnings():
        # torch scripts its forward-AD decompositions on first use, through a deprecated API
        warnings.filterwarnings("ignore", "`torch.jit.script` is deprecated", DeprecationWarning)
        dual = forward_ad.make_dual(torch.ones_like(nll), tangent)
        with pytest.raises(RuntimeError, match="^head_nll: first derivatives only"):
            torch.autograd.grad(nll, x, dual)
