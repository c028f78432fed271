"""The single-chunk SSD (C loops) against its naive reference, the chunked reference and gradcheck."""

from __future__ import annotations

import pytest
import torch

from dynlab.kernels.compiled import C_KERNELS_ENV
from dynlab.kernels.ssd import single_chunk as sc
from dynlab.kernels.ssd.chunked import ssd_ref
from dynlab.kernels.ssd.grouped import ssd_grouped
from dynlab.kernels.ssd.single_chunk import ssd_single_chunk, ssd_single_chunk_ref

# float32: both sides round sums of up to T·N and T·H·P terms of size ~1 (gradients of dt sum more)
TOL = {torch.float32: dict(rtol=1e-4, atol=1e-4), torch.float64: dict(rtol=1e-12, atol=1e-12)}


@pytest.fixture(params=["c", "torch"], ids=["c-kernel", "reference"])
def backend(request, monkeypatch):
    if request.param == "torch":
        monkeypatch.setenv(C_KERNELS_ENV, "0")
    else:
        monkeypatch.delenv(C_KERNELS_ENV, raising=False)
        if sc.c_library() is None:
            pytest.skip(f"compiled single-chunk SSD {sc.compiled_kernel_status()}")
    return request.param


def _inputs(dtype, g=3, t=9, h=2, p=5, n=6, seed=0):
    """x, B and C as slices of one wider last dim (the stack's split), dt > 0, A < 0."""
    gen = torch.Generator().manual_seed(seed)
    wide = torch.randn(g, t, h * p + 2 * n + 3, generator=gen, dtype=dtype).requires_grad_(True)
    dt = (0.05 + 0.5 * torch.rand(g, t, h, generator=gen, dtype=dtype)).requires_grad_(True)
    A = (-0.1 - 2 * torch.rand(g, h, generator=gen, dtype=dtype)).requires_grad_(True)
    return wide, dt, A, (g, t, h, p, n)


def _split(wide, sizes):
    g, t, h, p, n = sizes
    xs, B, C, _ = torch.split(wide, [h * p, n, n, 3], dim=-1)
    return xs.reshape(g, t, h, p), B, C


def _sequential(x, dt, A, B, C):
    """SSD written out as its recurrence, one step at a time, apart from dynlab's forms (the
    module docstring's sums): ``h_t = exp(dt_t A) h_{t−1} + dt_t x_t B_tᵀ`` per sequence and
    head (``h [P, N]``, ``h_{−1} = 0``), ``y_t = h_t C_t``; the final state is the last ``h``."""
    g, t, h, p = x.shape
    state = x.new_zeros(g, h, p, B.shape[-1])
    ys = []
    for i in range(t):
        decay = torch.exp(dt[:, i] * A)[:, :, None, None]  # [G, H, 1, 1]
        state = decay * state + (dt[:, i, :, None] * x[:, i])[..., None] * B[:, i, None, None, :]
        ys.append((state * C[:, i, None, None, :]).sum(dim=-1))  # [G, H, P]
    return torch.stack(ys, dim=1), state


def _run(fn, dtype, final_grad, exact=False, **kw):
    """Outputs and gradients of a random loss on them; ``exact``: the same inputs (and loss
    weights) in float64."""
    wide, dt, A, sizes = _inputs(dtype, **kw)
    if exact:
        wide, dt, A = (v.detach().double().requires_grad_(True) for v in (wide, dt, A))
    x, B, C = _split(wide, sizes)
    y, fin = fn(x, dt, A, B, C)
    gen = torch.Generator().manual_seed(9)
    loss = (y * torch.randn(y.shape, generator=gen, dtype=dtype).to(y.dtype)).sum()
    if final_grad:
        loss = loss + (fin * torch.randn(fin.shape, generator=gen, dtype=dtype).to(y.dtype)).sum()
    loss.backward()
    return [y.detach(), fin.detach(), wide.grad, dt.grad, A.grad]


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize("final_grad", [False, True])
@pytest.mark.parametrize("sizes", [dict(), dict(t=32, h=2, p=16, n=32), dict(g=2, t=1, h=3, p=1, n=1), dict(t=17, p=7, n=19)])
def test_outputs_and_gradients_match_the_naive_reference(backend, dtype, final_grad, sizes):
    """ssd_single_chunk (the C loops, or the naive reference where they are off) and the naive
    reference, outputs and every gradient, against the float64 step-by-step recurrence."""
    want = _run(_sequential, dtype, final_grad, exact=True, **sizes)
    for fn in (ssd_single_chunk, ssd_single_chunk_ref):
        got = _run(fn, dtype, final_grad, **sizes)
        for a, b in zip(got, want):
            assert a.dtype == dtype
            torch.testing.assert_close(a.double(), b, **TOL[dtype])


def test_equal_rates_equal_the_chunked_reference(backend):
    wide, dt, A, sizes = _inputs(torch.float64)
    A0 = A.detach()[:1].expand_as(A).clone().requires_grad_(True)
    x, B, C = _split(wide, sizes)
    y, fin = ssd_single_chunk(x, dt, A0, B, C)
    h = sizes[2]
    Bh, Ch = (v[:, :, None, :].expand(*v.shape[:2], h, v.shape[-1]) for v in (B, C))
    y_ref, fin_ref = ssd_ref(x, dt, A0[0], Bh, Ch, None, True)
    torch.testing.assert_close(y, y_ref, **TOL[torch.float64])
    torch.testing.assert_close(fin, fin_ref, **TOL[torch.float64])


@pytest.mark.parametrize("final_grad", [False, True])
def test_gradcheck_float64(backend, final_grad):
    wide, dt, A, sizes = _inputs(torch.float64, g=2, t=5, h=2, p=3, n=4)

    def f(w, d, a):
        y, fin = ssd_single_chunk(*_split(w, sizes)[:1], d, a, *_split(w, sizes)[1:])
        return (y, fin) if final_grad else y

    assert torch.autograd.gradcheck(f, (wide, dt, A))


def test_the_grouped_scan_runs_the_c_loops_for_one_chunk_only(monkeypatch):
    monkeypatch.delenv(C_KERNELS_ENV, raising=False)
    if sc.c_library() is None:
        pytest.skip(f"compiled single-chunk SSD {sc.compiled_kernel_status()}")
    wide, dt, A, sizes = _inputs(torch.float32)
    x, B, C = _split(wide, sizes)
    y, _ = ssd_grouped(x, dt, A, B, C, None, chunk_size=16)
    assert type(y.grad_fn).__name__ == "_SSDSingleChunkCBackward"
    y, _ = ssd_grouped(x, dt, A, B, C, None, chunk_size=4)  # several chunks: the torch form
    assert type(y.grad_fn).__name__ != "_SSDSingleChunkCBackward"


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_without_the_final_state_y_and_its_gradients_are_the_same_bit_for_bit(dtype):
    """need_final=False: the C loops skip the final state (None); y and the gradients of a
    loss on y alone are those of the full call exactly."""
    if sc.c_library() is None:
        pytest.skip(f"compiled single-chunk SSD {sc.compiled_kernel_status()}")
    runs = []
    for need in (True, False):
        wide, dt, A, sizes = _inputs(dtype, t=12, h=3, p=4, n=7)
        x, B, C = _split(wide, sizes)
        y, fin = ssd_single_chunk(x, dt, A, B, C, need_final=need)
        assert (fin is None) == (not need)
        (y * torch.randn(y.shape, generator=torch.Generator().manual_seed(2), dtype=dtype)).sum().backward()
        runs.append([y.detach(), wide.grad, dt.grad, A.grad])
    for a, b in zip(*runs):
        assert torch.equal(a, b)
