"""Triton kernels vs their pure-torch references, run on the CPU by Triton's interpreter.

``triton.jit`` picks the interpreter when ``TRITON_INTERPRET=1`` is set before triton is
first imported; tests/conftest.py sets it on machines without CUDA.  With CUDA the same
tests run the compiled kernels on the GPU.  Sizes are small: the interpreter runs every
kernel step as numpy operations.
"""

from __future__ import annotations

import os

import pytest
import torch
from torch.func import vmap

from dynlab.kernels import dispatch
from dynlab.kernels.gla.chunked import gla_ref
from dynlab.kernels.scan.chunked import linear_scan, linear_scan_ref
from dynlab.kernels.selective_scan.chunked import selective_scan_ref
from dynlab.kernels.ssd.chunked import ssd_chunked, ssd_ref

DEV = torch.device("cuda" if torch.cuda.is_available() else "cpu")
if DEV.type == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
    pytest.skip("Triton on the CPU needs TRITON_INTERPRET=1 before triton is imported", allow_module_level=True)
triton = pytest.importorskip("triton", reason="triton is not installed (pip install 'dynlab[triton]')")

from dynlab.kernels.gla import triton as triton_gla  # noqa: E402
from dynlab.kernels.scan import triton as triton_scan  # noqa: E402
from dynlab.kernels.ssd import triton as triton_ssd  # noqa: E402

TOL = {
    torch.float64: dict(rtol=1e-10, atol=1e-10),
    torch.complex128: dict(rtol=1e-10, atol=1e-10),
    torch.float32: dict(rtol=2e-5, atol=2e-5),
    torch.complex64: dict(rtol=2e-5, atol=2e-5),
}
CHUNK_TOL = dict(rtol=2e-4, atol=2e-5)  # float32 chunked forms (different summation order)


@pytest.fixture
def poisoned(monkeypatch):
    """Every buffer allocated with torch.empty / empty_like starts as NaN."""

    def poison() -> None:
        empty, empty_like = torch.empty, torch.empty_like
        monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
        monkeypatch.setattr(torch, "empty_like", lambda *a, **k: empty_like(*a, **k).fill_(float("nan")))

    return poison


def _rand(shape, dtype, gen):
    x = torch.randn(shape, generator=gen, dtype=torch.float64)
    if dtype.is_complex:
        return torch.complex(x, torch.randn(shape, generator=gen, dtype=torch.float64)).to(DEV, dtype)
    return x.to(DEV, dtype)


def _coeffs(kind, shape, dtype, gen):
    if kind == "rotation":  # r·e^{iθ}, |r| < 1
        r = torch.rand(shape, generator=gen, dtype=torch.float64)
        th = 2 * torch.pi * torch.rand(shape, generator=gen, dtype=torch.float64)
        return torch.polar(r, th).to(DEV, dtype)
    return (2 * torch.rand(shape, generator=gen, dtype=torch.float64) - 1).to(DEV, dtype)  # (−1, 1)


SCAN_CASES = [
    ("real", torch.float32),
    ("real", torch.float64),
    ("rotation", torch.complex64),
    ("rotation", torch.complex128),
]


@pytest.mark.parametrize("kind,dtype", SCAN_CASES, ids=[f"{k}-{str(d).removeprefix('torch.')}" for k, d in SCAN_CASES])
@pytest.mark.slow
def test_triton_linear_scan_matches_reference(kind, dtype, poisoned):
    """Outputs, final state and gradients of a, b, h0; S = 37 spans two channel blocks."""
    gen = torch.Generator().manual_seed(3)
    a = _coeffs(kind, (2, 11, 37), dtype, gen).requires_grad_()
    b = _rand((2, 11, 37), dtype, gen).requires_grad_()
    h0 = _rand((2, 37), dtype, gen).requires_grad_()
    ref = linear_scan_ref(a, b, h0)
    w = _rand(ref.shape, dtype, gen)
    g_ref = torch.autograd.grad((ref * w.conj()).real.sum(), (a, b, h0))
    poisoned()
    out = triton_scan.linear_scan_triton(a, b, h0)
    g_out = torch.autograd.grad((out * w.conj()).real.sum(), (a, b, h0))
    torch.testing.assert_close(out, ref, **TOL[dtype])
    torch.testing.assert_close(out[:, -1], ref[:, -1], **TOL[dtype])  # final state
    for name, x, y in zip(("a", "b", "h0"), g_out, g_ref):
        torch.testing.assert_close(x, y, **TOL[dtype], msg=f"grad {name}")


@pytest.mark.slow
def test_triton_linear_scan_broadcast_and_vmap():
    """Broadcast leading dims (gradients summed back) and a vmapped model dimension."""
    gen = torch.Generator().manual_seed(4)
    a = _coeffs("real", (3, 1, 6, 5), torch.float64, gen).requires_grad_()
    b = _rand((2, 6, 5), torch.float64, gen)
    h0 = _rand((5,), torch.float64, gen).requires_grad_()
    out = vmap(lambda a_: triton_scan.linear_scan_triton(a_, b, h0))(a)
    ref = torch.stack([linear_scan_ref(a[i].expand(2, 6, 5), b, h0.expand(2, 5)) for i in range(3)])
    torch.testing.assert_close(out, ref, rtol=1e-10, atol=1e-10)
    for x, y in zip(torch.autograd.grad(out.sum(), (a, h0)), torch.autograd.grad(ref.sum(), (a, h0))):
        torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)


def _ssd_inputs(t=37, seed=0):
    g = torch.Generator().manual_seed(seed)
    b, h, p, n = 2, 3, 4, 5
    return [
        x.to(DEV)
        for x in (
            torch.randn(b, t, h, p, generator=g),
            torch.nn.functional.softplus(torch.randn(b, t, h, generator=g) - 1.0),
            -torch.exp(torch.randn(h, generator=g)),
            torch.randn(b, t, h, n, generator=g),
            torch.randn(b, t, h, n, generator=g),
            torch.randn(b, h, p, n, generator=g),
        )
    ]


@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "with-init"])
@pytest.mark.parametrize("chunk", [16, 32], ids=lambda c: f"chunk{c}")
@pytest.mark.slow
def test_triton_ssd_matches_reference(with_init, chunk, poisoned):
    """T = 37 is not a multiple of the chunk: the padded tail of the last chunk is exercised."""
    leaves = [x.requires_grad_() for x in _ssd_inputs()]
    x, dt, A, B, C, h0 = leaves
    init = h0 if with_init else None
    y_ref, s_ref = ssd_ref(x, dt, A, B, C, init, True)
    poisoned()
    y, s = triton_ssd.ssd_triton(x, dt, A, B, C, init, True, chunk_size=chunk)
    torch.testing.assert_close(y, y_ref, **CHUNK_TOL)
    torch.testing.assert_close(s, s_ref, **CHUNK_TOL)
    used = leaves if with_init else leaves[:-1]
    w, ws = torch.randn_like(y_ref), torch.randn_like(s_ref)
    g_ref = torch.autograd.grad((y_ref * w).sum() + (s_ref * ws).sum(), used)
    g_out = torch.autograd.grad((y * w).sum() + (s * ws).sum(), used)
    for x_, y_ in zip(g_out, g_ref):
        torch.testing.assert_close(x_, y_, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_triton_ssd_split_and_carry():
    """Two calls carrying the final state equal one call (initial-state path)."""
    x, dt, A, B, C, h0 = _ssd_inputs(t=40, seed=1)
    y, s = triton_ssd.ssd_triton(x, dt, A, B, C, h0, True, chunk_size=16)
    y1, s1 = triton_ssd.ssd_triton(x[:, :23], dt[:, :23], A, B[:, :23], C[:, :23], h0, True, chunk_size=16)
    y2, s2 = triton_ssd.ssd_triton(x[:, 23:], dt[:, 23:], A, B[:, 23:], C[:, 23:], s1, True, chunk_size=16)
    torch.testing.assert_close(torch.cat([y1, y2], 1), y, **CHUNK_TOL)
    torch.testing.assert_close(s2, s, **CHUNK_TOL)


def _gla_inputs(seed=0, t=37, k=6, v=5):
    g = torch.Generator().manual_seed(seed)
    b, h = 2, 3
    return [
        x.to(DEV)
        for x in (
            torch.randn(b, t, h, k, generator=g),
            torch.randn(b, t, h, k, generator=g),
            torch.randn(b, t, h, v, generator=g),
            3 * torch.nn.functional.logsigmoid(torch.randn(b, t, h, k, generator=g)),  # strong decays too
            torch.randn(b, h, k, v, generator=g),
        )
    ]


@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "with-init"])
@pytest.mark.slow
def test_triton_gla_matches_reference(with_init, poisoned):
    leaves = [x.requires_grad_() for x in _gla_inputs()]
    q, k, v, gk, h0 = leaves
    init = h0 if with_init else None
    o_ref, s_ref = gla_ref(q, k, v, gk, None, init, True)
    poisoned()
    o, s = triton_gla.gla_triton(q, k, v, gk, None, init, True)
    torch.testing.assert_close(o, o_ref, **CHUNK_TOL)
    torch.testing.assert_close(s, s_ref, **CHUNK_TOL)
    used = leaves if with_init else leaves[:-1]
    w, ws = torch.randn_like(o_ref), torch.randn_like(s_ref)
    g_ref = torch.autograd.grad((o_ref * w).sum() + (s_ref * ws).sum(), used)
    g_out = torch.autograd.grad((o * w).sum() + (s * ws).sum(), used)
    for x_, y_ in zip(g_out, g_ref):
        torch.testing.assert_close(x_, y_, rtol=1e-3, atol=1e-4)


@pytest.mark.slow
def test_triton_gla_strong_decay_does_not_overflow():
    """Log gates of −30 per step: exp(−c_s) alone would overflow float32 inside a chunk."""
    q, k, v, _, h0 = _gla_inputs(seed=2, t=20)
    gk = torch.full_like(q, -30.0)
    o, s = triton_gla.gla_triton(q, k, v, gk, None, h0, True)
    o_ref, s_ref = gla_ref(q, k, v, gk, None, h0, True)
    assert torch.isfinite(o).all()
    torch.testing.assert_close(o, o_ref, **CHUNK_TOL)
    torch.testing.assert_close(s, s_ref, **CHUNK_TOL)


@pytest.mark.parametrize("with_init", [False, True], ids=["zero-init", "with-init"])
@pytest.mark.slow
def test_triton_selective_scan_matches_reference(with_init):
    g = torch.Generator().manual_seed(5)
    u = torch.randn(2, 21, 5, generator=g)
    delta = torch.nn.functional.softplus(torch.randn(2, 21, 5, generator=g) - 1.0)
    A = -torch.exp(torch.randn(5, 4, generator=g))
    B, C = torch.randn(2, 21, 4, generator=g), torch.randn(2, 21, 4, generator=g)
    h0 = torch.randn(2, 5, 4, generator=g) if with_init else None
    u, delta, A, B, C = (x.to(DEV) for x in (u, delta, A, B, C))
    h0 = h0.to(DEV) if with_init else None
    y, s = triton_gla.selective_scan_triton(u, delta, A, B, C, h0, True)
    y_ref, s_ref = selective_scan_ref(u, delta, A, B, C, h0, True)
    torch.testing.assert_close(y, y_ref, **CHUNK_TOL)
    torch.testing.assert_close(s, s_ref, **CHUNK_TOL)


# ---- the dispatch table ------------------------------------------------------------------
@pytest.mark.parametrize("op", sorted(dispatch.TABLE))
def test_triton_dispatch_picks_torch_on_cpu_and_triton_on_cuda(op, monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(dispatch, "library_available", lambda name: False)
    assert dispatch.choose_backend(op, "cpu") == "torch"
    assert dispatch.choose_backend(op, torch.device("cuda", 0)) == "triton"
    assert dispatch.choose_backend(op, "cuda", torch.float64) == ("triton" if op == "linear_scan" else "torch")
    # training: only a Triton kernel with its own backward (the linear scan's); the others are forward-only
    trains = dispatch.choose_backend(op, "cuda", torch.float32, grad=True)
    assert trains == ("triton" if op == "linear_scan" else "torch")
    assert (op in dispatch.TRITON_FORWARD_ONLY) == (op != "linear_scan")
    assert dispatch.get_kernel(op, "cpu") is dispatch.resolve(dispatch.TABLE[op]["torch"])
    monkeypatch.setattr(dispatch, "HAS_TRITON", False)  # no triton installed: torch on CUDA too
    assert dispatch.choose_backend(op, "cuda") == "torch"


@pytest.mark.parametrize(("op", "library"), [("ssd", "mamba_ssm"), ("selective_scan", "mamba_ssm"), ("gla", "fla")])
def test_triton_dispatch_prefers_the_library_on_cuda_when_it_imports(op, library, monkeypatch):
    monkeypatch.delenv(dispatch.ENV_VAR, raising=False)
    monkeypatch.setattr(dispatch, "library_available", lambda name: name == library)
    for grad in (False, True):  # the library's kernels have their own backward: training too
        assert dispatch.choose_backend(op, "cuda", grad=grad) == library
    assert dispatch.choose_backend(op, "cpu") == "torch"  # never on the CPU
    assert dispatch.choose_backend(op, "cuda", torch.float64) == "torch"  # nor in a dtype it does not take
    others = [o for o in dispatch.TABLE if o != "linear_scan" and library not in dispatch.TABLE[o]]
    assert all(dispatch.choose_backend(o, "cuda") == "triton" for o in others)


def test_triton_dispatch_never_tries_mamba_ssm_without_cuda(monkeypatch):
    monkeypatch.setattr(dispatch, "_LIBS", {})
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert dispatch.mamba_ssm_available() is False
    assert not any(dispatch.library_available(name) for name in dispatch.LIBRARIES)


def test_triton_dispatch_env_override_and_bad_value(monkeypatch):
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    assert dispatch.choose_backend("ssd", "cpu") == "triton"
    monkeypatch.setenv(dispatch.ENV_VAR, "cuda-please")
    with pytest.raises(ValueError, match="allowed: auto, torch, triton, mamba_ssm, fla, causal_conv1d"):
        dispatch.choose_backend("ssd", "cpu")
    with pytest.raises(ValueError, match="unknown operation"):
        dispatch.choose_backend("conv", "cpu")


@pytest.mark.slow
def test_triton_dispatch_forced_triton_runs_the_kernels_on_cpu(monkeypatch):
    """The front functions call what the table picks: forcing triton gives the kernels' results."""
    monkeypatch.setenv(dispatch.ENV_VAR, "triton")
    gen = torch.Generator().manual_seed(8)
    a, b, h0 = _coeffs("real", (2, 7, 4), torch.float64, gen), _rand((2, 7, 4), torch.float64, gen), _rand((2, 4), torch.float64, gen)
    torch.testing.assert_close(dispatch.linear_scan(a, b, h0), linear_scan(a, b, h0), rtol=1e-10, atol=1e-10)
    x, dt, A, B, C, s0 = _ssd_inputs(t=9)
    y, s = dispatch.ssd(x, dt, A, B, C, s0, True, 16)
    y_ref, s_ref = ssd_chunked(x, dt, A, B, C, s0, True, 16)
    torch.testing.assert_close(y, y_ref, **CHUNK_TOL)
    torch.testing.assert_close(s, s_ref, **CHUNK_TOL)
    monkeypatch.setenv(dispatch.ENV_VAR, "torch")
    u = x[..., 0]  # [B, T, H] as a selective scan's [B, T, D]
    Am = -torch.exp(torch.randn(3, 4, generator=gen)).to(DEV)
    Bm, Cm = torch.randn(2, 9, 4, generator=gen).to(DEV), torch.randn(2, 9, 4, generator=gen).to(DEV)
    torch.testing.assert_close(dispatch.selective_scan(u, dt, Am, Bm, Cm), selective_scan_ref(u, dt, Am, Bm, Cm), **CHUNK_TOL)
