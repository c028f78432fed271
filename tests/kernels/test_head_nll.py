"""The LM head fused with its cross-entropy (softmax kept, gradient in place) against the autograd
reference and a per-member log-sum-exp written out here, on both backends."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynlab.kernels.compiled import C_KERNELS_ENV
from dynlab.kernels.cross_entropy import head_nll, head_nll_ref
from dynlab.kernels.cross_entropy import loss as ce

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.fixture(params=["c", "torch"], ids=["c-kernel", "torch"])
def backend(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setenv(C_KERNELS_ENV, "0")
    else:
        monkeypatch.delenv(C_KERNELS_ENV, raising=False)
        if ce._c_library() is None:
            pytest.skip(f"compiled cross-entropy {ce.compiled_kernel_status()}")
    return request.param


def _inputs(dtype, e=3, n=20, d=5, v=11, scale=2.0, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = (torch.randn(e, n, d, generator=g, dtype=dtype) * scale).requires_grad_(True)
    w = torch.randn(e, v, d, generator=g, dtype=dtype).requires_grad_(True)
    return x, w, torch.randint(0, v, (e, n), generator=g)


def _written_out(x, w, targets):
    """Per member and token: logsumexp of the logits minus the target's, no batched op."""
    rows = []
    for e in range(x.shape[0]):
        logits = x[e] @ w[e].T
        rows.append(torch.logsumexp(logits, dim=1) - logits.gather(1, targets[e][:, None])[:, 0])
    return torch.stack(rows)


def test_gradcheck_float64(backend):
    x, w, targets = _inputs(torch.float64, e=2, n=5, d=3, v=4)
    assert torch.autograd.gradcheck(lambda a, b: head_nll(a, b, targets), (x, w))


@pytest.mark.parametrize("scale", [1.0, 30.0])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_equal_the_reference(backend, dtype, scale):
    x, w, targets = _inputs(dtype, scale=scale)
    go = torch.randn(targets.shape, generator=torch.Generator().manual_seed(3), dtype=dtype)
    out, ref = head_nll(x, w, targets), head_nll_ref(x, w, targets)
    torch.testing.assert_close(out, ref, **TOL[dtype])
    for a, b in zip(torch.autograd.grad(out, (x, w), go), torch.autograd.grad(ref, (x, w), go)):
        torch.testing.assert_close(a, b, **TOL[dtype])


def test_reference_is_the_written_out_loss():
    x, w, targets = _inputs(torch.float64)
    torch.testing.assert_close(head_nll_ref(x, w, targets), _written_out(x, w, targets), rtol=1e-12, atol=1e-12)


def test_every_entry_is_written(backend, nan_buffers):
    x, w, targets = _inputs(torch.float32, e=3, n=9, d=4, v=6)
    nan_buffers()
    out = head_nll(x, w, targets)
    gx, gw = torch.autograd.grad(out.sum(), (x, w))
    assert torch.isfinite(out).all() and torch.isfinite(gx).all() and torch.isfinite(gw).all()


def test_strided_weights_of_a_flat_buffer(backend):
    """The stack passes w as a view of its [E, P] parameter row (batch stride P)."""
    x, w, targets = _inputs(torch.float64)
    flat = torch.randn(3, 100, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    view = flat[:, 7:7 + 55].view(3, 11, 5)
    torch.testing.assert_close(head_nll(x, view, targets), _written_out(x, view, targets),
                               rtol=1e-12, atol=1e-12)


def test_a_second_backward_gives_the_same_gradients(backend):
    x, w, targets = _inputs(torch.float64)
    out = head_nll(x, w, targets).sum()
    first = torch.autograd.grad(out, (x, w), retain_graph=True)
    for a, b in zip(first, torch.autograd.grad(out, (x, w))):
        torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


def test_bad_shapes_and_targets_are_one_clear_error():
    x, w, targets = _inputs(torch.float32)
    with pytest.raises(ValueError, match="head_nll: need"):
        head_nll(x, w, targets[:, :-1])
    with pytest.raises(ValueError, match="targets must lie in"):
        head_nll(x, w, targets + 11)


@pytest.mark.parametrize("dtype, offset", [(torch.float32, 1e4), (torch.float32, 1e8), (torch.float64, 1e20)])
def test_a_large_common_offset_of_the_logits_changes_nothing(backend, dtype, offset):
    """Logits with a large common offset (x's first coordinate 1, every head row's first
    weight ``offset``): the loss is that of the unshifted logits (``lse − x_target`` would
    round the log-sum of exponentials away), and so is the gradient of the head's other
    coordinates (the softmax formed as ``exp(x − lse)`` would be 1 everywhere).  The
    expected values are float64 computations on the op's own logits minus the offset."""
    x, w, targets = _inputs(dtype, e=2, n=7, d=4, v=6)
    with torch.no_grad():
        x[..., 0] = 1.0
        w[..., 0] = offset
    out = head_nll(x, w, targets)
    gx, gw = torch.autograd.grad(out.sum(), (x, w))
    with torch.no_grad():
        unshifted = torch.bmm(x, w.transpose(1, 2)).double() - offset  # the op's logits, rounding included
    logp = torch.log_softmax(unshifted, dim=-1)
    want = -logp.gather(2, targets[..., None])[..., 0]
    glogits = logp.exp() - F.one_hot(targets, w.shape[1]).double()  # [E, N, V]
    tol = dict(rtol=2e-5, atol=2e-5) if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out.double(), want, **tol)
    torch.testing.assert_close(gx[..., 1:].double(), torch.bmm(glogits, w[..., 1:].detach().double()), **tol)
    torch.testing.assert_close(gw[..., 1:].double(),
                               torch.bmm(glogits.transpose(1, 2), x[..., 1:].detach().double()), **tol)


def test_empty_members_or_tokens_give_empty_results(backend):
    for e, n in ((0, 5), (2, 0)):
        x, w, targets = _inputs(torch.float32, e=e, n=n)
        out = head_nll(x, w, targets)
        assert out.shape == (e, n)
        gx, gw = torch.autograd.grad(out.sum(), (x, w))
        assert gx.shape == x.shape and gw.shape == w.shape and not gw.any()
