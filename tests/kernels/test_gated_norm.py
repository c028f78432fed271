"""The fused gated RMSNorm (C loops) against its autograd reference and nn.RMSNorm."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynlab.kernels.compiled import C_KERNELS_ENV
from dynlab.kernels.gated_norm import gated_rms_norm, gated_rms_norm_ref
from dynlab.kernels.gated_norm import norm as gn

TOL = {torch.float32: dict(rtol=1e-5, atol=1e-5), torch.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.fixture(params=["c", "torch"], ids=["c-kernel", "reference"])
def backend(request, monkeypatch):
    """Runs a test of :func:`gated_rms_norm` on the compiled loops and on its torch fallback."""
    if request.param == "torch":
        monkeypatch.setenv(C_KERNELS_ENV, "0")
    else:
        monkeypatch.delenv(C_KERNELS_ENV, raising=False)
        if gn.c_library() is None:
            pytest.skip(f"compiled gated norm {gn.compiled_kernel_status()}")
    return request.param


def _inputs(dtype, shape=(3, 2, 5, 8), seed=0):
    g = torch.Generator().manual_seed(seed)
    y = torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(True)
    z = torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(True)
    w = torch.randn(shape[0], shape[-1], generator=g, dtype=dtype).requires_grad_(True)
    return y, z, w


def _skip(dtype, shape=(3, 2, 5, 8), seed=1):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g, dtype=dtype).requires_grad_(True),
            torch.randn(shape[0], shape[-1], generator=g, dtype=dtype).requires_grad_(True))


def _sliced(dtype, shape=(3, 2, 5, 8), seed=2):
    """y, z and skip as slices of one wider last dim (a split of a linear layer's output), as the stack passes them."""
    g = torch.Generator().manual_seed(seed)
    d = shape[-1]
    wide = torch.randn(*shape[:-1], 3 * d + 3, generator=g, dtype=dtype).requires_grad_(True)
    y, z, s, _ = torch.split(wide, [d, d, d, 3], dim=-1)
    w = torch.randn(shape[0], d, generator=g, dtype=dtype).requires_grad_(True)
    sw = torch.randn(shape[0], d, generator=g, dtype=dtype).requires_grad_(True)
    return wide, y, z, w, s, sw


@pytest.mark.parametrize("eps", [1e-5, None])
@pytest.mark.parametrize("shape", [(3, 2, 5, 8), (2, 7, 3), (1, 4, 1)])
def test_gradcheck_float64(backend, eps, shape):
    y, z, w = _inputs(torch.float64, shape)
    assert torch.autograd.gradcheck(lambda a, b, c: gated_rms_norm(a, b, c, eps), (y, z, w))


def _plain(dtype):
    """The gated RMSNorm written out in float64, apart from dynlab's op, its reference and
    F.rms_norm — ``g = (y + skip_weight·skip) · z·sigmoid(z)``, ``g / sqrt(mean(g²) + eps) · w``
    per member — with gated_rms_norm's arguments; eps None is ``dtype``'s machine epsilon."""

    def norm(y, z, w, eps, skip=None, skip_weight=None):
        eps = torch.finfo(dtype).eps if eps is None else eps
        per_member = lambda v: v.double().view(v.shape[0], *([1] * (y.dim() - 2)), v.shape[1])  # noqa: E731
        u = y.double() if skip is None else y.double() + per_member(skip_weight) * skip.double()
        g = u * z.double() * torch.sigmoid(z.double())
        return g / torch.sqrt((g * g).mean(dim=-1, keepdim=True) + eps) * per_member(w)

    return norm


def _check_against_plain(dtype, leaves, call, go):
    """``call(fn, *leaves)`` for fn = gated_rms_norm (the C loops, or the reference where they
    are off) and gated_rms_norm_ref, values and the gradients of ``go · out`` in every leaf,
    against :func:`_plain` on float64 copies of the leaves."""
    exact = [x.detach().double().requires_grad_(True) for x in leaves]
    want = call(_plain(dtype), *exact)
    gwant = torch.autograd.grad(want, exact, go.double())
    for fn in (gated_rms_norm, gated_rms_norm_ref):
        out = call(fn, *leaves)
        assert out.dtype == dtype
        torch.testing.assert_close(out.double(), want.detach(), **TOL[dtype])
        for got, g in zip(torch.autograd.grad(out, leaves, go), gwant):
            torch.testing.assert_close(got.double(), g, **TOL[dtype])


@pytest.mark.parametrize("eps", [1e-5, None])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_equal_the_reference(backend, dtype, eps):
    y, z, w = _inputs(dtype)
    go = torch.randn(y.shape, generator=torch.Generator().manual_seed(5), dtype=dtype)
    _check_against_plain(dtype, [y, z, w], lambda fn, a, b, c: fn(a, b, c, eps), go)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_skip_and_sliced_inputs_equal_the_reference(backend, dtype):
    """Mamba-2's form (the skip ``D·x``), with y, z and the skip read in place from slices of
    one wider tensor, and with contiguous inputs: values and every gradient."""
    wide, y, z, w, s, sw = _sliced(dtype)
    d = y.shape[-1]
    go = torch.randn(y.shape, generator=torch.Generator().manual_seed(4), dtype=dtype)

    def sliced(fn, x, c, f):
        a, b, u, _ = torch.split(x, [d, d, d, 3], dim=-1)
        return fn(a, b, c, 1e-5, u, f)

    _check_against_plain(dtype, [wide, w, sw], sliced, go)
    y, z, w = _inputs(dtype)
    s, sw = _skip(dtype)
    _check_against_plain(dtype, [y, z, w, s, sw], lambda fn, *a: fn(*a[:3], None, *a[3:]), go)


def test_gradcheck_float64_with_skip(backend):
    y, z, w = _inputs(torch.float64)
    s, sw = _skip(torch.float64)
    assert torch.autograd.gradcheck(lambda a, b, c, d, f: gated_rms_norm(a, b, c, 1e-5, d, f), (y, z, w, s, sw))
    wide, y, z, w, s, sw = _sliced(torch.float64)
    assert torch.autograd.gradcheck(
        lambda x, c, f: gated_rms_norm(x[..., :8], x[..., 8:16], c, 1e-5, x[..., 16:24], f), (wide, w, sw))


def test_reference_with_skip_is_mamba2s_form():
    """Independent check of the skip: ``RMSNorm((y + D_h·x) · silu(z))`` with D one value per head
    of P channels (Mamba-2's), per member."""
    y, z, w = _inputs(torch.float64, (2, 3, 4, 6))
    x = torch.randn(2, 3, 4, 6, dtype=torch.float64)
    dh = torch.randn(2, 3, dtype=torch.float64)  # 3 heads of 2 channels
    out = gated_rms_norm_ref(y, z, w, 1e-5, x, dh.repeat_interleave(2, dim=1))
    for e in range(2):
        u = (y[e].view(3, 4, 3, 2) + dh[e][:, None] * x[e].view(3, 4, 3, 2)).reshape(3, 4, 6)
        norm = torch.nn.RMSNorm(6, eps=1e-5, dtype=torch.float64)
        with torch.no_grad():
            norm.weight.copy_(w[e])
        torch.testing.assert_close(out[e], norm(u * F.silu(z[e])), rtol=1e-12, atol=1e-12)


def test_reference_is_nn_rmsnorm_of_the_gated_input_per_member():
    """Independent check: per member, ``nn.RMSNorm`` (its weight set to the member's) of ``y · silu(z)``."""
    y, z, w = _inputs(torch.float64)
    for eps in (1e-5, None):
        out = gated_rms_norm_ref(y, z, w, eps)
        for e in range(y.shape[0]):
            norm = torch.nn.RMSNorm(y.shape[-1], eps=eps, dtype=torch.float64)
            with torch.no_grad():
                norm.weight.copy_(w[e])
            torch.testing.assert_close(out[e], norm(y[e] * F.silu(z[e])), rtol=1e-12, atol=1e-12)


def test_float32_saturated_gates_match(backend):
    y, z, w = _inputs(torch.float32)
    with torch.no_grad():
        z.mul_(40.0)
    out, ref = gated_rms_norm(y, z, w, 1e-5), gated_rms_norm_ref(y, z, w, 1e-5)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, **TOL[torch.float32])
    torch.testing.assert_close(out.double(), _plain(torch.float32)(y, z, w, 1e-5).detach(), **TOL[torch.float32])


def test_bad_shapes_are_one_clear_error():
    y, z, w = _inputs(torch.float32)
    with pytest.raises(ValueError, match="gated_rms_norm: need"):
        gated_rms_norm(y, z, w[:, :-1], 1e-5)
    with pytest.raises(ValueError, match="gated_rms_norm: need"):
        gated_rms_norm(y, z, w, 1e-5, y)  # a skip without its weight


def test_c_kernel_is_built_where_a_compiler_exists(monkeypatch):
    import shutil

    monkeypatch.delenv(C_KERNELS_ENV, raising=False)
    if shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"):
        assert gn.compiled_kernel_status().startswith("compiled: ")
    monkeypatch.setenv(C_KERNELS_ENV, "0")
    assert gn.c_library() is None


def test_empty_inputs_give_empty_results(backend):
    """No members, or members of width 0: the reference's empty result, and empty gradients."""
    for e, t, d in ((0, 3, 4), (2, 3, 0)):
        y, z = (torch.randn(e, t, d, requires_grad=True) for _ in range(2))
        w = torch.randn(e, d, requires_grad=True)
        out = gated_rms_norm(y, z, w, None)
        assert out.shape == (e, t, d)
        assert all(g.shape == v.shape for g, v in zip(torch.autograd.grad(out.sum(), (y, z, w), allow_unused=True),
                                                       (y, z, w)))
