"""Mamba-1 selective scan kernel: chunked vs sequential, split-and-carry, closed form."""

from __future__ import annotations

import math

import pytest
import torch

from dynlab.kernels.selective_scan import selective_scan_chunked, selective_scan_fused, selective_scan_sequential

TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-5)}


def _inputs(dtype: torch.dtype, b: int = 2, t: int = 31, d: int = 5, n: int = 4, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    u = torch.randn(b, t, d, generator=g, dtype=dtype)
    delta = torch.nn.functional.softplus(torch.randn(b, t, d, generator=g, dtype=dtype) - 1.0)
    A = -torch.exp(torch.randn(d, n, generator=g, dtype=dtype))
    B = torch.randn(b, t, n, generator=g, dtype=dtype)
    C = torch.randn(b, t, n, generator=g, dtype=dtype)
    h0 = torch.randn(b, d, n, generator=g, dtype=dtype)
    return [u, delta, A, B, C, h0]


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("chunk_size", [1, 8, 32], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "with-init"])
def test_chunked_matches_sequential_outputs_states_gradients(dtype, chunk_size, with_init):
    leaves = [a.requires_grad_() for a in _inputs(dtype)]
    u, delta, A, B, C, h0 = leaves
    init = h0 if with_init else None
    y_ref, s_ref = selective_scan_sequential(u, delta, A, B, C, initial_state=init, return_final_state=True)
    y_chk, s_chk = selective_scan_chunked(u, delta, A, B, C, initial_state=init, return_final_state=True,
                                          chunk_size=chunk_size)
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
        assert g_ref[-1].abs().sum() > 0


@pytest.mark.parametrize(
    "impl", [selective_scan_sequential, selective_scan_chunked, selective_scan_fused], ids=["sequential", "chunked", "fused"]
)
@pytest.mark.parametrize("k", [1, 16, 30], ids=lambda k: f"split{k}")
def test_split_and_carry(impl, k):
    u, delta, A, B, C, h0 = _inputs(torch.float64)
    y, s = impl(u, delta, A, B, C, initial_state=h0, return_final_state=True)
    y1, s1 = impl(u[:, :k], delta[:, :k], A, B[:, :k], C[:, :k], initial_state=h0, return_final_state=True)
    y2, s2 = impl(u[:, k:], delta[:, k:], A, B[:, k:], C[:, k:], initial_state=s1, return_final_state=True)
    torch.testing.assert_close(torch.cat([y1, y2], dim=1), y, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s2, s, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    "impl", [selective_scan_sequential, selective_scan_chunked, selective_scan_fused], ids=["sequential", "chunked", "fused"]
)
def test_closed_form_per_channel_decay(impl):
    """Two channels with decays a_d, constant input c, Δ = B = C = 1: h_T[d] = a_d^T h0 + c (1 − a_d^T)/(1 − a_d)."""
    decays, c, h0, T = [0.5, 0.95], 0.3, -1.0, 25
    u = torch.full((1, T, 2), c, dtype=torch.float64)
    A = torch.tensor([[math.log(a)] for a in decays], dtype=torch.float64)  # [D=2, N=1]
    ones = torch.ones(1, T, 1, dtype=torch.float64)
    _, s = impl(u, torch.ones(1, T, 2, dtype=torch.float64), A, ones, ones,
                initial_state=torch.full((1, 2, 1), h0, dtype=torch.float64), return_final_state=True)
    for d, a in enumerate(decays):
        assert s[0, d, 0].item() == pytest.approx(a**T * h0 + c * (1 - a**T) / (1 - a), rel=1e-12)


def test_bad_shape_raises():
    u, delta, A, B, C, _ = _inputs(torch.float64)
    with pytest.raises(ValueError, match="A must be"):
        selective_scan_chunked(u, delta, A[:2], B, C)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "with-init"])
@pytest.mark.parametrize("outputs", ["y-and-state", "y-only", "state-only"])
def test_fused_matches_sequential_outputs_states_gradients(dtype, with_init, outputs, nan_buffers):
    """The hand-written backward, with every buffer it allocates NaN-poisoned."""
    leaves = [a.requires_grad_() for a in _inputs(dtype)]
    u, delta, A, B, C, h0 = leaves
    init = h0 if with_init else None
    y_ref, s_ref = selective_scan_sequential(u, delta, A, B, C, initial_state=init, return_final_state=True)
    g = torch.Generator().manual_seed(2)
    wy, ws = torch.randn(y_ref.shape, generator=g, dtype=dtype), torch.randn(s_ref.shape, generator=g, dtype=dtype)
    used = leaves if with_init else leaves[:-1]
    def loss_of(y, s):
        return ((y * wy).sum() if outputs != "state-only" else 0) + ((s * ws).sum() if outputs != "y-only" else 0)

    loss_ref = loss_of(y_ref, s_ref)
    g_ref = torch.autograd.grad(loss_ref, used, materialize_grads=True)  # C is unused when only the state counts
    nan_buffers()
    y, s = selective_scan_fused(u, delta, A, B, C, initial_state=init, return_final_state=True)
    torch.testing.assert_close(y, y_ref, **TOL[dtype])
    torch.testing.assert_close(s, s_ref, **TOL[dtype])
    loss = loss_of(y, s)
    for name, a, b in zip(("u", "delta", "A", "B", "C", "h0"), torch.autograd.grad(loss, used, materialize_grads=True), g_ref):
        torch.testing.assert_close(a, b, **TOL[dtype], msg=f"grad {name}")


def test_fused_empty_sequence_returns_the_initial_state():
    u, delta, A, B, C, h0 = _inputs(torch.float64, t=0)
    y, s = selective_scan_fused(u, delta, A, B, C, initial_state=h0, return_final_state=True)
    assert y.shape == (2, 0, 5)
    torch.testing.assert_close(s, h0)
