"""The fused per-token cross-entropy (C loops) against F.cross_entropy and a log-sum-exp form."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynlab.kernels.compiled import C_KERNELS_ENV
from dynlab.kernels.cross_entropy import loss as ce
from dynlab.kernels.cross_entropy import token_nll, token_nll_ref

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.fixture(params=["c", "torch"], ids=["c-kernel", "reference"])
def backend(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setenv(C_KERNELS_ENV, "0")
    else:
        monkeypatch.delenv(C_KERNELS_ENV, raising=False)
        if ce._c_library() is None:
            pytest.skip(f"compiled cross-entropy {ce.compiled_kernel_status()}")
    return request.param


def _inputs(dtype, n=40, v=256, scale=3.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    logits = (torch.randn(n, v, generator=g, dtype=dtype) * scale).requires_grad_(True)
    return logits, torch.randint(0, v, (n,), generator=g)


def test_gradcheck_float64(backend):
    logits, targets = _inputs(torch.float64, n=6, v=7)
    assert torch.autograd.gradcheck(lambda x: token_nll(x, targets), (logits,))


def _plain_nll(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """The loss written out in float64, apart from dynlab's op and from F.cross_entropy:
    minus the target's entry of log_softmax."""
    return -torch.log_softmax(logits.double(), dim=1).gather(1, targets[:, None])[:, 0]


@pytest.mark.parametrize("scale", [1.0, 30.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_equal_the_reference(backend, dtype, scale):
    """token_nll (the C loops, or the reference where they are off) and token_nll_ref, values
    and gradients, against :func:`_plain_nll` (so the reference backend is checked too)."""
    logits, targets = _inputs(dtype, scale=scale)
    go = torch.randn(logits.shape[0], generator=torch.Generator().manual_seed(3), dtype=dtype)
    exact = logits.detach().double().requires_grad_(True)
    want = _plain_nll(exact, targets)
    (gwant,) = torch.autograd.grad(want, exact, go.double())
    for fn in (token_nll, token_nll_ref):
        out = fn(logits, targets)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), want.detach(), **TOL[dtype])
        torch.testing.assert_close(torch.autograd.grad(out, logits, go)[0].double(), gwant, **TOL[dtype])


def test_reference_is_logsumexp_minus_the_target_logit():
    logits, targets = _inputs(torch.float64)
    want = torch.logsumexp(logits, dim=1) - logits.gather(1, targets[:, None])[:, 0]
    torch.testing.assert_close(token_nll_ref(logits, targets), want, rtol=1e-12, atol=1e-12)


def test_out_of_range_targets_and_bad_shapes_are_one_clear_error(backend):
    logits, targets = _inputs(torch.float32)
    with pytest.raises(ValueError, match="token_nll: need"):
        token_nll(logits, targets[:-1])
    if backend == "c":
        with pytest.raises(ValueError, match="targets must lie in"):
            token_nll(logits, targets + 256)


def test_c_kernel_is_built_where_a_compiler_exists(monkeypatch):
    import shutil

    monkeypatch.delenv(C_KERNELS_ENV, raising=False)
    if shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"):
        assert ce.compiled_kernel_status().startswith("compiled: ")
    monkeypatch.setenv(C_KERNELS_ENV, "0")
    assert ce._c_library() is None


@pytest.mark.parametrize("dtype, offset", [(torch.float32, 1e4), (torch.float32, 1e8), (torch.float64, 1e20)])
def test_a_large_common_offset_of_the_logits_changes_nothing(backend, dtype, offset):
    """Cross-entropy is invariant to a common shift of a row's logits: with an offset whose
    ulp exceeds the row's log-sum of exponentials, ``lse − x_target`` would round that sum
    away (the loss 0, every gradient entry ``g``); the loss and gradient must be those of the
    unshifted logits, to the rounding of the shift itself."""
    g = torch.Generator().manual_seed(3)
    base = torch.randn(6, 9, generator=g, dtype=torch.float64)
    targets = torch.randint(0, 9, (6,), generator=g)
    shifted = (base + offset).to(dtype)  # what the kernel sees: the offset's rounding included
    exact = (shifted.double() - offset).requires_grad_(True)  # the same logits, unshifted, in float64
    want = F.cross_entropy(exact, targets, reduction="none")
    (gwant,) = torch.autograd.grad(want.sum(), exact)
    x = shifted.clone().requires_grad_(True)
    got = token_nll(x, targets)
    (ggot,) = torch.autograd.grad(got.sum(), x)
    tol = dict(rtol=1e-5, atol=1e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(got.double(), want, **tol)
    torch.testing.assert_close(ggot.double(), gwant, **tol)
