"""The fused short causal convolution + SiLU (C loops and torch form) against its autograd reference."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynlab.kernels.compiled import C_KERNELS_ENV
from dynlab.kernels.short_conv import causal_conv_silu, causal_conv_silu_ref, last_window
from dynlab.kernels.short_conv import conv as sc
from dynlab.lm.models.mixers import causal_conv

TOL32 = dict(rtol=1e-5, atol=1e-5)


@pytest.fixture(params=["c", "torch"], ids=["c-kernel", "torch-form"])
def backend(request, monkeypatch):
    """Runs a test of :func:`causal_conv_silu` on the compiled loops and on the torch form."""
    if request.param == "torch":
        monkeypatch.setenv(C_KERNELS_ENV, "0")
    else:
        monkeypatch.delenv(C_KERNELS_ENV, raising=False)
        if sc.c_library() is None:
            pytest.skip(f"compiled short conv {sc.compiled_kernel_status()}")
    return request.param


def _inputs(dtype, t=6, k=4, bias=True, past=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    e, b, c = 3, 2, 5
    x = torch.randn(e, b, t, c, generator=g, dtype=dtype)
    w = torch.randn(e, k, c, generator=g, dtype=dtype)
    bs = torch.randn(e, c, generator=g, dtype=dtype) if bias else None
    ps = torch.randn(e, b, k - 1, c, generator=g, dtype=dtype) if past else None
    return [v if v is None else v.requires_grad_(True) for v in (x, w, bs, ps)]


CASES = [dict(), dict(bias=False), dict(past=False), dict(bias=False, past=False), dict(t=2), dict(t=1, k=4),
         dict(k=1, past=False), dict(k=2)]


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
def test_gradcheck_float64(backend, case):
    """Hand-written backward: finite differences in float64, every input (x, taps, bias, window)."""
    inputs = _inputs(torch.float64, **case)
    assert torch.autograd.gradcheck(causal_conv_silu, tuple(inputs))


@pytest.mark.parametrize("case", CASES, ids=[str(c) for c in CASES])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_values_and_gradients_equal_the_reference(backend, case, dtype):
    inputs = _inputs(dtype, **case)
    live = [v for v in inputs if v is not None]
    go = torch.randn(inputs[0].shape, generator=torch.Generator().manual_seed(9), dtype=dtype)
    out, ref = causal_conv_silu(*inputs), causal_conv_silu_ref(*inputs)
    tol = TOL32 if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref, **tol)
    for got, want in zip(torch.autograd.grad(out, live, go), torch.autograd.grad(ref, live, go)):
        torch.testing.assert_close(got, want, **tol)


def test_reference_is_the_mixers_causal_conv_per_member():
    """The reference is :func:`dynlab.lm.models.mixers.causal_conv` (the one-model loop's) for each
    member, and :func:`last_window` its new window, also for a chunk shorter than the window."""
    for t in (6, 2):
        x, w, bs, ps = _inputs(torch.float64, t=t)
        out = causal_conv_silu_ref(x, w, bs, ps)
        window = last_window(x, ps, w.shape[1])
        for e in range(x.shape[0]):
            y, win = causal_conv(x[e], w[e].t()[:, None, :], bs[e], ps[e].transpose(1, 2))
            torch.testing.assert_close(out[e], y, rtol=1e-12, atol=1e-12)
            torch.testing.assert_close(window[e].transpose(1, 2), win, rtol=0, atol=0)


def test_reference_is_an_independent_convolution():
    """The reference against torch's depthwise ``conv1d`` on the zero-padded sequence."""
    x, w, bs, ps = _inputs(torch.float64)
    e, b, t, c = x.shape
    out = causal_conv_silu_ref(x, w, bs, ps)
    for i in range(e):
        full = torch.cat([ps[i], x[i]], dim=1).transpose(1, 2)  # [B, C, K - 1 + T]
        want = F.silu(F.conv1d(full, w[i].t()[:, None, :], bs[i], groups=c)).transpose(1, 2)
        torch.testing.assert_close(out[i], want, rtol=1e-12, atol=1e-12)
    assert out.shape == (e, b, t, c)


def test_float32_large_inputs_stay_finite_and_match(backend):
    """Pre-activations far out on both sides of the SiLU (its exp saturates) match the reference."""
    x, w, bs, ps = _inputs(torch.float32, t=8)
    with torch.no_grad():
        x.mul_(40.0)
    out, ref = causal_conv_silu(x, w, bs, ps), causal_conv_silu_ref(x, w, bs, ps)
    assert torch.isfinite(out).all()
    torch.testing.assert_close(out, ref, rtol=1e-5, atol=1e-4)


def test_bad_shapes_are_one_clear_error():
    x, w, bs, ps = _inputs(torch.float32)
    with pytest.raises(ValueError, match="causal_conv_silu: need"):
        causal_conv_silu(x, w[:, :, :-1], bs, ps)


def test_c_kernel_is_built_where_a_compiler_exists(monkeypatch):
    import shutil

    monkeypatch.delenv(C_KERNELS_ENV, raising=False)
    if shutil.which("cc") or shutil.which("gcc") or shutil.which("clang"):
        assert sc.compiled_kernel_status().startswith("compiled: ")
    monkeypatch.setenv(C_KERNELS_ENV, "0")
    assert sc.c_library() is None


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_a_slice_of_a_wider_tensor_is_read_in_place_and_matches(backend, dtype):
    """x as the stack passes it (a split of a linear layer's output, rows spaced wider than C):
    values and gradients, the wider tensor's included, equal the reference's."""
    g = torch.Generator().manual_seed(3)
    wide = torch.randn(3, 2, 6, 12, generator=g, dtype=dtype).requires_grad_(True)
    x = torch.split(wide, [4, 5, 3], dim=-1)[1]  # [3, 2, 6, 5], row stride 12
    _, w, bs, ps = _inputs(dtype)
    go = torch.randn(x.shape, generator=g, dtype=dtype)
    out, ref = causal_conv_silu(x, w, bs, ps), causal_conv_silu_ref(x, w, bs, ps)
    tol = TOL32 if dtype == torch.float32 else dict(rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(out, ref, **tol)
    for got, want in zip(torch.autograd.grad(out, (wide, w, bs, ps), go), torch.autograd.grad(ref, (wide, w, bs, ps), go)):
        torch.testing.assert_close(got, want, **tol)
    if dtype == torch.float64:
        assert torch.autograd.gradcheck(lambda v: causal_conv_silu(v[..., 4:9], w, bs, ps), (wide,))
