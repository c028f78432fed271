"""ssd_grouped's zero-initial-state shortcut: a zero state that needs no gradient is not read
out, and every number equals the full computation (the read-out of zeros) and the reference."""

from __future__ import annotations

import pytest
import torch

from dynlab.kernels.ssd.chunked import ssd_ref
from dynlab.kernels.ssd.grouped import ssd_grouped
from dynlab.kernels.ssd.single_chunk import single_chunk_applies


def _leaves(dtype, g=3, t=37, h=2, p=3, n=4, seed=5):
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(g, t, h, p, generator=gen, dtype=dtype).requires_grad_(True)
    dt = torch.rand(g, t, h, generator=gen, dtype=dtype).requires_grad_(True)
    B = torch.randn(g, t, n, generator=gen, dtype=dtype).requires_grad_(True)
    C = torch.randn(g, t, n, generator=gen, dtype=dtype).requires_grad_(True)
    A = (-4.0 * torch.rand(g, h, generator=gen, dtype=dtype)).requires_grad_(True)
    return x, dt, A, B, C


@pytest.mark.parametrize("t", [37, 16, 5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_zero_state_none_and_a_zero_state_with_gradient_agree_with_the_reference(dtype, t):
    """Three ways to start from zeros: None, a zero tensor (the shortcut) and a zero tensor that
    requires a gradient (the full read-out, whose gradient is the state's): the same outputs,
    final states and input gradients, and those of ssd_ref with B, C expanded over the heads."""
    x, dt, A, B, C = _leaves(dtype, t=t)
    g, _, h, p = x.shape
    n = B.shape[-1]
    gen = torch.Generator().manual_seed(1)
    wy = torch.randn(g, t, h, p, generator=gen, dtype=dtype)
    ws = torch.randn(g, h, p, n, generator=gen, dtype=dtype)
    results = []
    for init in (None, torch.zeros(g, h, p, n, dtype=dtype), torch.zeros(g, h, p, n, dtype=dtype, requires_grad=True)):
        y, s = ssd_grouped(x, dt, A, B, C, init, chunk_size=16)
        ins = (x, dt, A, B, C) if init is None or not init.requires_grad else (x, dt, A, B, C, init)
        results.append((y, s, torch.autograd.grad((y * wy).sum() + (s * ws).sum(), ins)))
    tol = dict(rtol=1e-10, atol=1e-12) if dtype == torch.float64 else dict(rtol=1e-5, atol=1e-5)
    # one chunk from zeros runs the single-chunk C loops where they apply; the full read-out
    # (a state with a gradient) runs the torch form: equal to rounding, not bit for bit
    fused = t <= 16 and single_chunk_applies(x, dt, A, B, C)
    for k, (y, s, grads) in enumerate(results[1:], 1):
        same = tol if fused and k == 2 else dict(rtol=0, atol=0)
        torch.testing.assert_close(y, results[0][0], **same)
        torch.testing.assert_close(s, results[0][1], **same)
        for got, want in zip(grads[:5], results[0][2]):
            torch.testing.assert_close(got, want, **same)
    # the state's own gradient, from the full read-out, against the reference's
    # the reference takes one A per head: compared sequence by sequence
    for i in range(g):
        h0 = torch.zeros(1, h, p, n, dtype=dtype, requires_grad=True)
        yr, sr = ssd_ref(x.detach()[i:i + 1], dt.detach()[i:i + 1], A.detach()[i], B.detach()[i:i + 1, :, None].expand(1, t, h, n),
                         C.detach()[i:i + 1, :, None].expand(1, t, h, n), h0, True)
        torch.testing.assert_close(results[0][0][i:i + 1], yr, **tol)
        torch.testing.assert_close(results[0][1][i:i + 1], sr, **tol)
        (gh0,) = torch.autograd.grad((yr * wy[i:i + 1]).sum() + (sr * ws[i:i + 1]).sum(), (h0,))
        torch.testing.assert_close(results[2][2][5][i:i + 1], gh0, **tol)


def test_a_nonzero_state_is_read_out():
    """The shortcut takes only zeros: a state with one nonzero entry changes the outputs."""
    x, dt, A, B, C = _leaves(torch.float64)
    g, _, h, p = x.shape
    init = torch.zeros(g, h, p, B.shape[-1], dtype=torch.float64)
    init[1, 0, 2, 3] = 1.0
    y0, _ = ssd_grouped(x, dt, A, B, C, None, chunk_size=16)  # several chunks: the torch form both times
    y1, _ = ssd_grouped(x, dt, A, B, C, init, chunk_size=16)
    assert torch.equal(y0[0], y1[0]) and not torch.allclose(y0[1], y1[1])
