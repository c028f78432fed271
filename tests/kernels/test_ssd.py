"""Mamba-2 SSD kernel: chunked vs the reference (ssd_ref), split-and-carry, closed form."""

from __future__ import annotations

import math

import pytest
import torch

from dynlab.kernels.ssd.chunked import ssd_chunked, ssd_ref

TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-5)}


def _inputs(dtype: torch.dtype, b: int = 2, t: int = 37, h: int = 3, p: int = 4, n: int = 5, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(b, t, h, p, generator=g, dtype=dtype)
    dt = torch.nn.functional.softplus(torch.randn(b, t, h, generator=g, dtype=dtype) - 1.0)
    A = -torch.exp(torch.randn(h, generator=g, dtype=dtype))
    B = torch.randn(b, t, h, n, generator=g, dtype=dtype)
    C = torch.randn(b, t, h, n, generator=g, dtype=dtype)
    h0 = torch.randn(b, h, p, n, generator=g, dtype=dtype)
    return [x, dt, A, B, C, h0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("chunk_size", [1, 8, 16, 64], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "with-init"])
def test_chunked_matches_ref_outputs_states_gradients(dtype, chunk_size, with_init):
    leaves = [a.requires_grad_() for a in _inputs(dtype)]
    x, dt, A, B, C, h0 = leaves
    init = h0 if with_init else None
    y_ref, s_ref = ssd_ref(x, dt, A, B, C, initial_state=init, return_final_state=True)
    y_chk, s_chk = ssd_chunked(x, dt, A, B, C, initial_state=init, return_final_state=True, chunk_size=chunk_size)
    torch.testing.assert_close(y_chk, y_ref, **TOL[dtype])
    torch.testing.assert_close(s_chk, s_ref, **TOL[dtype])
    g = torch.Generator().manual_seed(1)
    wy, ws = torch.randn(y_ref.shape, generator=g, dtype=dtype), torch.randn(s_ref.shape, generator=g, dtype=dtype)
    used = leaves if with_init else leaves[:-1]
    g_ref = torch.autograd.grad((y_ref * wy).sum() + (s_ref * ws).sum(), used)
    g_chk = torch.autograd.grad((y_chk * wy).sum() + (s_chk * ws).sum(), used)
    for a, b in zip(g_chk, g_ref):
        torch.testing.assert_close(a, b, **TOL[dtype])
    if with_init:
        assert g_ref[-1].abs().sum() > 0  # gradient reaches the initial state


@pytest.mark.parametrize("impl", [ssd_ref, ssd_chunked], ids=["ref", "chunked"])
@pytest.mark.parametrize("k", [1, 13, 36], ids=lambda k: f"split{k}")
def test_split_and_carry(impl, k):
    x, dt, A, B, C, h0 = _inputs(torch.float64)
    y, s = impl(x, dt, A, B, C, initial_state=h0, return_final_state=True)
    y1, s1 = impl(x[:, :k], dt[:, :k], A, B[:, :k], C[:, :k], initial_state=h0, return_final_state=True)
    y2, s2 = impl(x[:, k:], dt[:, k:], A, B[:, k:], C[:, k:], initial_state=s1, return_final_state=True)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s2, s, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", [ssd_ref, ssd_chunked], ids=["ref", "chunked"])
def test_closed_form_constant_input(impl):
    """Scalar decay a, constant input c, B = C = dt = 1: h_T = a^T h0 + c (1 − a^T)/(1 − a)."""
    a, c, h0, T = 0.9, 0.7, 2.5, 50
    x = torch.full((1, T, 1, 1), c, dtype=torch.float64)
    dt = torch.ones(1, T, 1, dtype=torch.float64)
    A = torch.tensor([math.log(a)], dtype=torch.float64)
    ones = torch.ones(1, T, 1, 1, dtype=torch.float64)
    y, s = impl(x, dt, A, ones, ones, initial_state=torch.full((1, 1, 1, 1), h0, dtype=torch.float64), return_final_state=True)
    expected = a**T * h0 + c * (1 - a**T) / (1 - a)
    assert s.item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert y[0, 9, 0, 0].item() == pytest.approx(a**10 * h0 + c * (1 - a**10) / (1 - a), rel=1e-12, abs=1e-12)


def test_initial_state_increment_is_added_to_zero_state_output():
    """y(h0) − y(0) = exp(cumsum(dt·A)) · (h0 · C): the initial state's increment alone."""
    x, dt, A, B, C, h0 = _inputs(torch.float64)
    inc = ssd_chunked(x, dt, A, B, C, initial_state=h0) - ssd_chunked(x, dt, A, B, C)
    decay = torch.exp(torch.cumsum(dt * A, dim=1))  # [B, T, H]
    expected = decay[..., None] * torch.einsum("bhpn,bthn->bthp", h0, C)
    torch.testing.assert_close(inc, expected, rtol=1e-10, atol=1e-10)


def test_bad_shape_raises():
    x, dt, A, B, C, _ = _inputs(torch.float64)
    with pytest.raises(ValueError, match="dt must be"):
        ssd_chunked(x, dt[:, :, :1], A, B, C)


@pytest.mark.parametrize("form", ["factored", "masked"])
def test_grouped_ssd_equals_the_reference_values_and_gradients(form, monkeypatch):
    """ssd_grouped (B, C shared by a sequence's heads; factored decay) equals ssd_ref with B, C
    expanded over the heads: outputs, final states and every input's gradient, float64."""
    import dynlab.kernels.ssd.grouped as grouped
    from dynlab.kernels.ssd.grouped import ssd_grouped

    if form == "masked":  # every chunk takes the masked per-head decay matrix
        monkeypatch.setitem(grouped._FACTOR_LIMIT, torch.float64, -1.0)

    g_, t, h, p, n = 3, 37, 2, 3, 4
    gen = torch.Generator().manual_seed(11)

    def leaf(*shape, positive=False):
        v = torch.rand(*shape, generator=gen, dtype=torch.float64) if positive else torch.randn(
            *shape, generator=gen, dtype=torch.float64)
        return v.requires_grad_(True)

    x, dt, B, C = leaf(g_, t, h, p), leaf(g_, t, h, positive=True), leaf(g_, t, n), leaf(g_, t, n)
    A = (-4.0 * torch.rand(g_, h, generator=gen, dtype=torch.float64)).requires_grad_(True)
    h0 = leaf(g_, h, p, n)
    y, s = ssd_grouped(x, dt, A, B, C, h0, chunk_size=16)
    w = torch.randn(y.shape, generator=gen, dtype=torch.float64)
    ws = torch.randn(s.shape, generator=gen, dtype=torch.float64)
    grads = torch.autograd.grad((y * w).sum() + (s * ws).sum(), (x, dt, A, B, C, h0))
    for i in range(g_):
        args = [v[i:i + 1].detach().clone().requires_grad_(True) for v in (x, dt)]
        a_i = A[i].detach().clone().requires_grad_(True)
        b_i, c_i = (v[i:i + 1].detach().clone().requires_grad_(True) for v in (B, C))
        h_i = h0[i:i + 1].detach().clone().requires_grad_(True)
        yr, sr = ssd_ref(args[0], args[1], a_i, b_i[:, :, None].expand(1, t, h, n), c_i[:, :, None].expand(1, t, h, n),
                         h_i, True)
        torch.testing.assert_close(y[i:i + 1], yr, rtol=1e-10, atol=1e-12)
        torch.testing.assert_close(s[i:i + 1], sr, rtol=1e-10, atol=1e-12)
        ref = torch.autograd.grad((yr * w[i:i + 1]).sum() + (sr * ws[i:i + 1]).sum(), (*args, a_i, b_i, c_i, h_i))
        for got, want in zip((grads[0][i:i + 1], grads[1][i:i + 1], grads[2][i], grads[3][i:i + 1], grads[4][i:i + 1],
                              grads[5][i:i + 1]), ref):
            torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-11)


@pytest.mark.parametrize("c_kernels", ["1", "0"], ids=["c-kernels", "torch"])
def test_grouped_ssd_with_no_steps_or_no_sequences(c_kernels, monkeypatch):
    """T = 0: an empty output and the initial state carried through (zeros without one);
    G = 0 over several chunks: empty outputs, as ssd_ref gives."""
    from dynlab.kernels.compiled import C_KERNELS_ENV
    from dynlab.kernels.ssd.grouped import ssd_grouped

    monkeypatch.setenv(C_KERNELS_ENV, c_kernels)
    gen = torch.Generator().manual_seed(2)
    g_, h, p, n = 2, 2, 3, 4

    def empty(t, g=g_):
        return (torch.randn(g, t, h, p, generator=gen, dtype=torch.float64), torch.rand(g, t, h, generator=gen, dtype=torch.float64),
                -torch.rand(g, h, generator=gen, dtype=torch.float64), torch.randn(g, t, n, generator=gen, dtype=torch.float64),
                torch.randn(g, t, n, generator=gen, dtype=torch.float64))

    h0 = torch.randn(g_, h, p, n, generator=gen, dtype=torch.float64)
    y, s = ssd_grouped(*empty(0), h0)
    assert y.shape == (g_, 0, h, p) and torch.equal(s, h0)
    y, s = ssd_grouped(*empty(0))
    assert y.shape == (g_, 0, h, p) and torch.equal(s, torch.zeros(g_, h, p, n, dtype=torch.float64))
    x, dt, A, B, C = empty(5, g=0)
    y, s = ssd_grouped(x, dt, A, B, C, chunk_size=2)
    yr, sr = ssd_ref(x, dt, A[:1].expand(h).clone() if A.shape[0] else -torch.ones(h, dtype=torch.float64),
                     B[:, :, None].expand(0, 5, h, n), C[:, :, None].expand(0, 5, h, n), None, True)
    assert y.shape == yr.shape == (0, 5, h, p) and s.shape == sr.shape == (0, h, p, n)
