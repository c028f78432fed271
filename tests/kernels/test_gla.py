"""GLA kernel: chunked vs the reference (gla_ref), split-and-carry, closed form."""

from __future__ import annotations

import math

import pytest
import torch

from dynlab.kernels.gla.chunked import _FACTOR_LIMIT, _chunk_bounds, gla_chunked, gla_ref

TOL = {torch.float64: dict(rtol=1e-10, atol=1e-10), torch.float32: dict(rtol=2e-4, atol=2e-5)}


def _inputs(dtype: torch.dtype, b: int = 2, t: int = 29, h: int = 2, dk: int = 4, dv: int = 3, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(b, t, h, dk, generator=g, dtype=dtype)
    k = torch.randn(b, t, h, dk, generator=g, dtype=dtype)
    v = torch.randn(b, t, h, dv, generator=g, dtype=dtype)
    gk = torch.nn.functional.logsigmoid(torch.randn(b, t, h, dk, generator=g, dtype=dtype) + 2.0)
    h0 = torch.randn(b, h, dk, dv, generator=g, dtype=dtype)
    return [q, k, v, gk, h0]


def _assert_matches_ref(got, ref, leaves, w, tol):
    """``got = (o, s)`` equals ``ref = (o_ref, s_ref)`` to ``tol``, and so does the gradient of
    ``Σ o·w + Σ s`` with respect to every leaf."""
    (o, s), (o_ref, s_ref) = got, ref
    torch.testing.assert_close(o, o_ref, **tol)
    torch.testing.assert_close(s, s_ref, **tol)
    for a, b in zip(torch.autograd.grad((o * w).sum() + s.sum(), leaves),
                    torch.autograd.grad((o_ref * w).sum() + s_ref.sum(), leaves)):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("chunk_size", [1, 7, 32], ids=lambda c: f"chunk{c}")
@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "with-init"])
def test_chunked_matches_ref_outputs_states_gradients(dtype, chunk_size, with_init):
    leaves = [a.requires_grad_() for a in _inputs(dtype)]
    q, k, v, gk, h0 = leaves
    init = h0 if with_init else None
    o_ref, s_ref = gla_ref(q, k, v, gk, initial_state=init, return_final_state=True)
    o_chk, s_chk = gla_chunked(q, k, v, gk, initial_state=init, return_final_state=True, chunk_size=chunk_size)
    torch.testing.assert_close(o_chk, o_ref, **TOL[dtype])
    torch.testing.assert_close(s_chk, s_ref, **TOL[dtype])
    g = torch.Generator().manual_seed(1)
    wo, ws = torch.randn(o_ref.shape, generator=g, dtype=dtype), torch.randn(s_ref.shape, generator=g, dtype=dtype)
    used = leaves if with_init else leaves[:-1]
    g_ref = torch.autograd.grad((o_ref * wo).sum() + (s_ref * ws).sum(), used)
    g_chk = torch.autograd.grad((o_chk * wo).sum() + (s_chk * ws).sum(), used)
    for a, b in zip(g_chk, g_ref):
        torch.testing.assert_close(a, b, **TOL[dtype])
    if with_init:
        assert g_ref[-1].abs().sum() > 0


@pytest.mark.parametrize("impl", [gla_ref, gla_chunked], ids=["ref", "chunked"])
@pytest.mark.parametrize("split", [1, 11, 28], ids=lambda k: f"split{k}")
def test_split_and_carry(impl, split):
    q, k, v, gk, h0 = _inputs(torch.float64)
    o, s = impl(q, k, v, gk, initial_state=h0, return_final_state=True)
    o1, s1 = impl(q[:, :split], k[:, :split], v[:, :split], gk[:, :split], initial_state=h0, return_final_state=True)
    o2, s2 = impl(q[:, split:], k[:, split:], v[:, split:], gk[:, split:], initial_state=s1, return_final_state=True)
    torch.testing.assert_close(torch.cat([o1, o2], dim=1), o, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(s2, s, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("impl", [gla_ref, gla_chunked], ids=["ref", "chunked"])
def test_closed_form_constant_input(impl):
    """K = V = 1, gate a, k = 1, v = c, q = 1, scale 1: S_T = a^T S0 + c (1 − a^T)/(1 − a)."""
    a, c, s0, T = 0.8, -1.3, 4.0, 40
    one = torch.ones(1, T, 1, 1, dtype=torch.float64)
    o, s = impl(one, one, c * one, math.log(a) * one, scale=1.0,
                initial_state=torch.full((1, 1, 1, 1), s0, dtype=torch.float64), return_final_state=True)
    assert s.item() == pytest.approx(a**T * s0 + c * (1 - a**T) / (1 - a), rel=1e-12, abs=1e-12)
    assert o[0, -1, 0, 0].item() == pytest.approx(s.item(), rel=1e-12, abs=1e-12)


def test_default_scale_is_inverse_sqrt_key_dim():
    q, k, v, gk, h0 = _inputs(torch.float64)
    torch.testing.assert_close(gla_chunked(q, k, v, gk, initial_state=h0),
                               gla_chunked(q / 2.0, k, v, gk, scale=1.0, initial_state=h0), rtol=1e-12, atol=1e-12)


def test_bad_shape_raises():
    q, k, v, gk, _ = _inputs(torch.float64)
    with pytest.raises(ValueError, match="k and gk must match"):
        gla_chunked(q, k[..., :2], v, gk)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("path", ["factored", "masked"])
def test_both_intra_chunk_forms_match_ref(dtype, path, monkeypatch):
    """The GEMM form (exp(c_t)·exp(−c_s)) and the masked pairwise form, each forced, with gradients."""
    import dynlab.kernels.gla.chunked as gla_module

    limit = float("inf") if path == "factored" else -1.0
    monkeypatch.setattr(gla_module, "_FACTOR_LIMIT", {dtype: limit})
    leaves = [a.requires_grad_() for a in _inputs(dtype, t=40, seed=3)]
    q, k, v, gk, h0 = leaves
    o_ref, s_ref = gla_ref(q, k, v, gk, initial_state=h0, return_final_state=True)
    o, s = gla_chunked(q, k, v, gk, initial_state=h0, return_final_state=True, chunk_size=16)
    w = torch.randn(o_ref.shape, generator=torch.Generator().manual_seed(4), dtype=dtype)
    _assert_matches_ref((o, s), (o_ref, s_ref), leaves, w, TOL[dtype])


def test_strong_decay_stays_finite_and_exact():
    """Log gates of −30 per step: exp(−c_s) over a whole chunk would overflow float32, so the
    chunks must end early (three positions each here)."""
    q, k, v, _, h0 = _inputs(torch.float32, t=20, seed=5)
    gk = torch.full_like(q, -30.0)
    o, s = gla_chunked(q, k, v, gk, initial_state=h0, return_final_state=True, chunk_size=8)
    o_ref, s_ref = gla_ref(q, k, v, gk, initial_state=h0, return_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    torch.testing.assert_close(o, o_ref, **TOL[torch.float32])
    torch.testing.assert_close(s, s_ref, **TOL[torch.float32])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
@pytest.mark.parametrize("at", [0, 3, 7], ids=lambda a: f"reset-at-{a}")
def test_a_hard_reset_gate_of_minus_inf_matches_ref_with_gradients(dtype, at):
    """A log gate of −inf forgets the state exactly (exp(−inf) = 0), at a chunk's first
    position or inside one: the chunked form gives gla_ref's outputs, final state and
    gradients, none of them NaN (its chunk-local differences c_t − c_s must stay finite)."""
    q, k, v, gk, h0 = _inputs(dtype, t=12, seed=6)
    gk[:, at, 0] = float("-inf")  # head 0, every key: a hard reset at step `at`
    leaves = [x.clone().requires_grad_(True) for x in (q, k, v, h0)]
    o, s = gla_chunked(*leaves[:3], gk, initial_state=leaves[3], return_final_state=True, chunk_size=7)
    o_ref, s_ref = gla_ref(*leaves[:3], gk, initial_state=leaves[3], return_final_state=True)
    assert torch.isfinite(o).all() and torch.isfinite(s).all()
    w = torch.randn(o.shape, generator=torch.Generator().manual_seed(1), dtype=dtype)
    _assert_matches_ref((o, s), (o_ref, s_ref), leaves, w, TOL[dtype])


def test_chunk_bounds_end_before_the_cumulative_gate_exceeds_the_limit():
    """Constant gates −7 in one batch element and head (−0.1 elsewhere): with L = 30 a chunk
    holds its first position and the next four (drift 7, 14, 21, 28 ≤ 30; 35 > 30)."""
    gk = torch.full((2, 20, 3, 4), -0.1)
    gk[1, :, 2, 1] = -7.0
    assert _chunk_bounds(gk, 32, 30.0) == [(0, 5), (5, 10), (10, 15), (15, 20)]
    assert _chunk_bounds(gk, 32, 60.0) == [(0, 9), (9, 18), (18, 20)]  # 56 ≤ 60 < 63
    assert _chunk_bounds(gk, 3, 30.0) == [(s, min(s + 3, 20)) for s in range(0, 20, 3)]
    assert _chunk_bounds(gk[:1], 32, 30.0) == [(0, 20)]  # weak gates: one chunk
    assert _chunk_bounds(torch.full((1, 6, 1, 1), -100.0), 4, 30.0) == [(i, i + 1) for i in range(6)]
    assert _chunk_bounds(gk, 8, 0.0) == [(0, 8), (8, 16), (16, 20)]  # no factoring: fixed chunks


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_trained_strength_gates_match_ref_with_gradients(dtype):
    """Gates stronger than a trained GLA layer's (|Σ g| > 100 over 32 steps; trained layers
    reach ~40): one factored chunk of 32 would overflow float32 (e^100), so the chunks must
    end early. Initial and final state; values and all gradients equal the reference."""
    g = torch.Generator().manual_seed(7)
    q, k, v, _, h0 = _inputs(dtype, b=3, t=64, h=2, dk=8, dv=5, seed=6)
    gk = torch.nn.functional.logsigmoid(torch.randn(3, 64, 2, 8, generator=g, dtype=dtype) * 30.0 - 40.0) / 16.0
    assert gk[:, :32].sum(1).abs().max() > 100
    assert len(_chunk_bounds(gk, 32, _FACTOR_LIMIT[torch.float32])) > 2
    leaves = [a.requires_grad_() for a in (q, k, v, gk, h0)]
    o_ref, s_ref = gla_ref(*leaves[:4], initial_state=leaves[4], return_final_state=True)
    o, s = gla_chunked(*leaves[:4], initial_state=leaves[4], return_final_state=True, chunk_size=32)
    torch.testing.assert_close(o, o_ref, **TOL[dtype])
    torch.testing.assert_close(s, s_ref, **TOL[dtype])
    w = torch.randn(o_ref.shape, generator=g, dtype=dtype)
    ws = torch.randn(s_ref.shape, generator=g, dtype=dtype)
    for a, b in zip(torch.autograd.grad((o * w).sum() + (s * ws).sum(), leaves),
                    torch.autograd.grad((o_ref * w).sum() + (s_ref * ws).sum(), leaves)):
        torch.testing.assert_close(a, b, **TOL[dtype])


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["float64", "float32"])
def test_gates_of_either_sign_match_ref_with_gradients(dtype):
    """Log gates of both signs (c_t − c_0 not monotone, so the reference r is not at an end of
    the range): values, final state and gradients equal the reference (float32 with milder
    gates: growing states of e^±20 would swamp the reference's own rounding)."""
    g = torch.Generator().manual_seed(8)
    q, k, v, _, h0 = _inputs(dtype, b=2, t=24, h=2, dk=4, dv=3, seed=9)
    gk = torch.randn(2, 24, 2, 4, generator=g, dtype=dtype) * (2.0 if dtype == torch.float64 else 0.5)
    leaves = [a.requires_grad_() for a in (q, k, v, gk, h0)]
    o_ref, s_ref = gla_ref(*leaves[:4], initial_state=leaves[4], return_final_state=True)
    o, s = gla_chunked(*leaves[:4], initial_state=leaves[4], return_final_state=True, chunk_size=12)
    tol = dict(rtol=1e-10, atol=1e-8) if dtype == torch.float64 else TOL[dtype]
    w = torch.randn(o_ref.shape, generator=g, dtype=dtype)
    _assert_matches_ref((o, s), (o_ref, s_ref), leaves, w, tol)
