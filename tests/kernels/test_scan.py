"""Scan kernels: chunked diagonal scan and fused dense RNN scan vs references and closed forms."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from torch.func import vmap

from dynlab.kernels.scan.chunked import dense_rnn_ref, dense_rnn_scan, linear_scan, linear_scan_ref

TOL = {torch.float64: 1e-12, torch.float32: 2e-5, torch.complex128: 1e-12}


def _coeffs(kind: str, shape, dtype, gen):
    """Coefficients a for the sign regimes the cells produce."""
    if kind == "decay":  # mamba: (0, 1)
        a = torch.rand(shape, generator=gen, dtype=torch.float64)
    elif kind == "negative":  # negative-mamba: (−1, 1)
        a = 2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1
    elif kind == "zeros":  # decays that underflow to 0 must not produce NaN
        a = torch.rand(shape, generator=gen, dtype=torch.float64)
        a[..., ::3, :] = 0.0
    elif kind == "rotation":  # aussm / mamba3: r·e^{iθ}
        r = torch.rand(shape, generator=gen, dtype=torch.float64)
        th = 2 * torch.pi * torch.rand(shape, generator=gen, dtype=torch.float64)
        return torch.polar(r, th)
    else:
        raise AssertionError(kind)
    return a.to(dtype)


def _rand(shape, dtype, gen):
    if dtype.is_complex:
        return torch.complex(torch.randn(shape, generator=gen, dtype=torch.float64), torch.randn(shape, generator=gen, dtype=torch.float64))
    return torch.randn(shape, generator=gen, dtype=torch.float64).to(dtype)


CASES = [
    ("decay", torch.float64),
    ("negative", torch.float64),
    ("zeros", torch.float64),
    ("negative", torch.float32),
    ("rotation", torch.complex128),
]


@pytest.mark.parametrize("kind,dtype", CASES, ids=[f"{k}-{str(d).removeprefix('torch.')}" for k, d in CASES])
@pytest.mark.parametrize("length,chunk", [(1, None), (17, None), (17, 1), (17, 4), (60, None), (23, 100)], ids=lambda v: str(v))
def test_linear_scan_matches_reference(kind, dtype, length, chunk):
    gen = torch.Generator().manual_seed(length * 31 + (chunk or 0))
    a = _coeffs(kind, (3, length, 5), dtype, gen).requires_grad_()
    b = _rand((3, length, 5), dtype, gen).requires_grad_()
    h0 = _rand((3, 5), dtype, gen).requires_grad_()
    ref = linear_scan_ref(a, b, h0)
    out = linear_scan(a, b, h0, chunk)
    tol = TOL[dtype]
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    torch.testing.assert_close(out[:, -1], ref[:, -1], rtol=tol, atol=tol)  # final state
    w = _rand(ref.shape, dtype, gen)  # fresh cotangent
    g_ref = torch.autograd.grad((ref * w.conj()).real.sum(), (a, b, h0))
    g_out = torch.autograd.grad((out * w.conj()).real.sum(), (a, b, h0))
    for name, x, y in zip("a b h0".split(), g_out, g_ref):
        torch.testing.assert_close(x, y, rtol=10 * tol, atol=10 * tol, msg=f"grad {name}")


def test_linear_scan_constant_coefficient_closed_form():
    """h_t = a^{t+1} h0 + Σ_{s≤t} a^{t−s} b_s, computed independently in numpy."""
    gen = np.random.default_rng(5)
    a_val, t_len = -0.93, 37
    b = gen.standard_normal((t_len, 4))
    h0 = gen.standard_normal(4)
    expect = np.stack([a_val ** (t + 1) * h0 + sum(a_val ** (t - s) * b[s] for s in range(t + 1)) for t in range(t_len)])
    out = linear_scan(torch.full((t_len, 4), a_val, dtype=torch.float64), torch.from_numpy(b), torch.from_numpy(h0), chunk=6)
    np.testing.assert_allclose(out.numpy(), expect, rtol=1e-12, atol=1e-12)


def test_linear_scan_broadcasts_leading_dims():
    gen = torch.Generator().manual_seed(0)
    a = torch.rand(1, 9, 3, generator=gen, dtype=torch.float64)
    b = torch.randn(4, 9, 3, generator=gen, dtype=torch.float64)
    h0 = torch.randn(3, generator=gen, dtype=torch.float64)
    out = linear_scan(a, b, h0)
    ref = linear_scan_ref(a.expand(4, 9, 3), b, h0.expand(4, 3))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)


def test_linear_scan_does_not_read_uninitialised_buffers(monkeypatch):
    """Fresh buffers are NaN-poisoned: any entry the kernel forgets to write shows up."""
    gen = torch.Generator().manual_seed(1)
    a = (2 * torch.rand(2, 29, 6, generator=gen, dtype=torch.float64) - 1).requires_grad_()
    b = torch.randn(2, 29, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    h0 = torch.randn(2, 6, generator=gen, dtype=torch.float64, requires_grad=True)
    ref = linear_scan_ref(a, b, h0)
    g_ref = torch.autograd.grad(ref.square().sum(), (a, b, h0))
    _poison(monkeypatch)
    out = linear_scan(a, b, h0, chunk=5)
    g_out = torch.autograd.grad(out.square().sum(), (a, b, h0))
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    for x, y in zip(g_out, g_ref):
        torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-11)


def _poison(monkeypatch):
    empty, empty_like = torch.empty, torch.empty_like

    def nan_empty(*args, **kw):
        return empty(*args, **kw).fill_(float("nan"))

    def nan_empty_like(*args, **kw):
        return empty_like(*args, **kw).fill_(float("nan"))

    monkeypatch.setattr(torch, "empty", nan_empty)
    monkeypatch.setattr(torch, "empty_like", nan_empty_like)


DENSE = [("tanh", False), ("tanh", True), ("identity", False), ("identity", True)]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("phi,gated", DENSE, ids=[f"{p}-{'gate' if g else 'nogate'}" for p, g in DENSE])
def test_dense_scan_matches_reference(phi, gated, dtype):
    gen = torch.Generator().manual_seed(7)
    s = 6
    drive = torch.randn(5, 13, s, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    A = (torch.randn(s, s, generator=gen, dtype=torch.float64) / 2).to(dtype).requires_grad_()
    h0 = torch.randn(5, s, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    gate = torch.rand(5, 13, s, generator=gen, dtype=torch.float64).to(dtype).requires_grad_() if gated else None
    ins = [drive, A, h0] + ([gate] if gated else [])
    ref = dense_rnn_ref(drive, A, h0, gate, phi)
    out = dense_rnn_scan(drive, A, h0, gate, phi)
    tol = TOL[dtype]
    torch.testing.assert_close(out, ref, rtol=tol, atol=tol)
    w = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(dtype)
    g_ref = torch.autograd.grad((ref * w).sum(), ins)
    g_out = torch.autograd.grad((out * w).sum(), ins)
    for name, x, y in zip(["drive", "A", "h0", "gate"], g_out, g_ref):
        torch.testing.assert_close(x, y, rtol=20 * tol, atol=20 * tol, msg=f"grad {name}")


def test_dense_scan_zero_recurrence_is_pointwise():
    """With A = 0, h_t = tanh(d_t) and ∂L/∂d = (1 − h²)·w exactly."""
    gen = torch.Generator().manual_seed(3)
    d = torch.randn(4, 9, 5, generator=gen, dtype=torch.float64, requires_grad=True)
    out = dense_rnn_scan(d, torch.zeros(5, 5, dtype=torch.float64), torch.randn(4, 5, generator=gen, dtype=torch.float64))
    w = torch.randn(4, 9, 5, generator=gen, dtype=torch.float64)
    (g,) = torch.autograd.grad((out * w).sum(), d)
    expect = np.tanh(d.detach().numpy())
    np.testing.assert_allclose(out.detach().numpy(), expect, rtol=1e-14, atol=1e-14)
    np.testing.assert_allclose(g.numpy(), (1 - expect**2) * w.numpy(), rtol=1e-13, atol=1e-13)


def test_dense_scan_does_not_read_uninitialised_buffers(monkeypatch):
    gen = torch.Generator().manual_seed(4)
    ins = [
        torch.randn(3, 11, 4, generator=gen, dtype=torch.float64, requires_grad=True),
        (torch.randn(4, 4, generator=gen, dtype=torch.float64) / 2).requires_grad_(),
        torch.randn(3, 4, generator=gen, dtype=torch.float64, requires_grad=True),
        torch.rand(3, 11, 4, generator=gen, dtype=torch.float64, requires_grad=True),
    ]
    for gate in (None, ins[3]):
        used = ins[:3] + ([gate] if gate is not None else [])
        ref = dense_rnn_ref(ins[0], ins[1], ins[2], gate)
        g_ref = torch.autograd.grad(ref.square().sum(), used)
        with monkeypatch.context() as m:
            _poison(m)
            out = dense_rnn_scan(ins[0], ins[1], ins[2], gate)
            g_out = torch.autograd.grad(out.square().sum(), used)
        torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
        for x, y in zip(g_out, g_ref):
            torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-11)


def test_dense_scan_under_vmap_equals_per_model_loop():
    """Stacked A [N, S, S] through vmap (the ensemble path) equals N separate runs."""
    gen = torch.Generator().manual_seed(9)
    n, s = 4, 5
    A = (torch.randn(n, s, s, generator=gen, dtype=torch.float64) / 2).requires_grad_()
    d = torch.randn(n, 3, 8, s, generator=gen, dtype=torch.float64, requires_grad=True)
    h0 = torch.zeros(3, s, dtype=torch.float64)
    out = vmap(lambda a_, d_: dense_rnn_scan(d_, a_, h0))(A, d)
    ref = torch.stack([dense_rnn_ref(d[i], A[i], h0) for i in range(n)])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    w = torch.randn(ref.shape, generator=gen, dtype=torch.float64)
    for x, y in zip(torch.autograd.grad((out * w).sum(), (A, d)), torch.autograd.grad((ref * w).sum(), (A, d))):
        torch.testing.assert_close(x, y, rtol=1e-11, atol=1e-11)


def test_linear_scan_under_vmap():
    gen = torch.Generator().manual_seed(2)
    a = (2 * torch.rand(3, 2, 10, 4, generator=gen, dtype=torch.float64) - 1).requires_grad_()
    b = torch.randn(2, 10, 4, generator=gen, dtype=torch.float64)
    h0 = torch.randn(2, 4, generator=gen, dtype=torch.float64)
    out = vmap(lambda a_: linear_scan(a_, b, h0, chunk=3))(a)
    ref = torch.stack([linear_scan_ref(a[i], b, h0) for i in range(3)])
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(
        torch.autograd.grad(out.sum(), a)[0], torch.autograd.grad(ref.sum(), a)[0], rtol=1e-11, atol=1e-11
    )


def test_bad_arguments_raise_value_error():
    x = torch.zeros(2, 3, 4)
    with pytest.raises(ValueError, match="phi"):
        dense_rnn_scan(x, torch.zeros(4, 4), torch.zeros(2, 4), phi="relu")
    with pytest.raises(ValueError, match="chunk"):
        linear_scan(x, x, torch.zeros(2, 4), chunk=0)
    with pytest.raises(ValueError, match="drive"):
        dense_rnn_scan(torch.zeros(3, 4), torch.zeros(4, 4), torch.zeros(2, 4))


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_scans_on_cuda_match_cpu():
    gen = torch.Generator().manual_seed(0)
    a = 2 * torch.rand(2, 33, 8, generator=gen) - 1
    b = torch.randn(2, 33, 8, generator=gen)
    h0 = torch.randn(2, 8, generator=gen)
    torch.testing.assert_close(linear_scan(a.cuda(), b.cuda(), h0.cuda()).cpu(), linear_scan(a, b, h0), rtol=1e-5, atol=1e-5)
    A = torch.randn(8, 8, generator=gen) / 3
    torch.testing.assert_close(dense_rnn_scan(b.cuda(), A.cuda(), h0.cuda()).cpu(), dense_rnn_scan(b, A, h0), rtol=1e-5, atol=1e-5)
