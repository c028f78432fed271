"""Fast cell scans and the training forward vs the generic loop, step(), and analytic Jacobians."""

from __future__ import annotations

import pytest
import torch
from torch.func import jacrev

from dynlab.tracking.models import BUILTIN_ARCHS, Tracker
from dynlab.tracking.models.cell_base import Cell
from dynlab.tracking.models.cells import TanhRNNCell
from dynlab.tracking.train.engine import tracker_logits

FAST = [
    ("tanh-rnn", None),
    ("tanh-rnn", "identity"),
    ("linear-rnn", None),
    ("token-gated-rnn", None),
    ("token-gated-rnn", "tanh"),
    ("mamba", None),
    ("negative-mamba", None),
    ("aussm", None),
    ("mamba3", None),
]
TOL = {torch.float64: (1e-11, 1e-11), torch.float32: (5e-5, 5e-5)}


def _cell(arch, phi, dtype, seed=0):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return Tracker(arch, 6, 6, hidden=8, nonlinearity=phi).cells[0].to(dtype)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=["f64", "f32"])
@pytest.mark.parametrize("arch,phi", FAST, ids=[f"{a}-{p or 'default'}" for a, p in FAST])
def test_fast_scan_matches_generic_loop(arch, phi, dtype, monkeypatch):
    cell = _cell(arch, phi, dtype)
    gen = torch.Generator().manual_seed(sum(map(ord, f"{arch}{phi}")))
    u = torch.randn(5, 23, cell.d_in, generator=gen, dtype=torch.float64).to(dtype)
    h0 = torch.randn(5, cell.state_size, generator=gen, dtype=torch.float64).to(dtype).requires_grad_()
    params = [h0, *cell.parameters()]
    p = cell.precompute(u)
    ref = Cell.scan(cell, h0, p)
    w = torch.randn(ref.shape, generator=gen, dtype=torch.float64).to(dtype)
    g_ref = torch.autograd.grad((cell.readout(ref, p) * w[..., : cell.out_size]).sum(), params, allow_unused=True)
    # The fast path must not fall back to the per-step transition.
    monkeypatch.setattr(cell, "transition", lambda *a: (_ for _ in ()).throw(AssertionError("generic loop used")))
    p = cell.precompute(u)
    out = cell.scan(h0, p)
    g_out = torch.autograd.grad((cell.readout(out, p) * w[..., : cell.out_size]).sum(), params, allow_unused=True)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(out, ref, rtol=rtol, atol=atol)
    torch.testing.assert_close(out[:, -1], ref[:, -1], rtol=rtol, atol=atol)
    names = ["h0", *(n for n, _ in cell.named_parameters())]
    for name, x, y in zip(names, g_out, g_ref):
        if y is None:
            assert x is None or not x.any(), name
            continue
        torch.testing.assert_close(x, y, rtol=10 * rtol, atol=10 * atol, msg=f"grad {name}")


@pytest.mark.parametrize("arch", BUILTIN_ARCHS)
def test_step_agrees_with_forward(arch):
    cell = _cell(arch, None, torch.float64, seed=1)
    gen = torch.Generator().manual_seed(11)
    u = torch.randn(3, 17, cell.d_in, generator=gen, dtype=torch.float64)
    h = torch.randn(3, cell.state_size, generator=gen, dtype=torch.float64)
    y, hs = cell(u, h)
    for t in range(u.shape[1]):
        y_t, h = cell.step(h, u[:, t])
        torch.testing.assert_close(h, hs[:, t], rtol=1e-11, atol=1e-11)
        torch.testing.assert_close(y_t, y[:, t], rtol=1e-11, atol=1e-11)


@pytest.mark.parametrize("arch", [*BUILTIN_ARCHS, "test-exact-perm"])
def test_training_logits_equal_tracker_forward(arch):
    """``tracker_logits`` (table gather, time-major) equals ``Tracker.forward``; 2 layers."""
    layers = 1 if arch == "test-exact-perm" else 2
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(4)
        model = Tracker(arch, 6, 6, hidden=8, layers=layers).double()
    tokens = torch.randint(0, 6, (4, 19), generator=torch.Generator().manual_seed(0))
    ref = model(tokens).logits
    out = tracker_logits(model, tokens)
    torch.testing.assert_close(out, ref, rtol=1e-12, atol=1e-12)
    params = [p for p in model.parameters() if p.requires_grad]
    if params:
        w = torch.randn(ref.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
        g_ref = torch.autograd.grad((ref * w).sum(), params)
        g_out = torch.autograd.grad((out * w).sum(), params)
        for x, y in zip(g_out, g_ref):
            torch.testing.assert_close(x, y, rtol=1e-10, atol=1e-10)


def test_jacrev_on_step_matches_analytic_jacobians():
    """torch.func still works on Tracker.step: J = diag(1 − h'²)·A (tanh-rnn), diag(Ā) (mamba)."""
    gen = torch.Generator().manual_seed(2)
    for arch in ("tanh-rnn", "mamba"):
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = Tracker(arch, 6, 6, hidden=8).double()
        h = torch.randn(1, model.state_size, generator=gen, dtype=torch.float64)
        tok = torch.tensor([3])
        jac = jacrev(lambda s: model.step(s, tok)[1])(h)[0, :, 0]  # [S, S]
        cell = model.cells[0]
        if arch == "tanh-rnn":
            h_new = model.step(h, tok)[1][0]
            expect = (1 - h_new**2)[:, None] * cell.A.detach()
        else:
            expect = torch.diag(cell.precompute(model.embed(tok)[:, None])["decay"][0, 0].detach())
        torch.testing.assert_close(jac.detach(), expect, rtol=1e-12, atol=1e-12)


class _ReluTanhRNN(TanhRNNCell):
    """A user subclass with its own transition: must run the generic loop, not the fused scan."""

    def transition(self, h, p):
        return torch.relu(self._ah(h) + p["drive"])


def test_user_subclass_with_own_transition_uses_its_transition():
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        cell = _ReluTanhRNN(4, 6).double()
    gen = torch.Generator().manual_seed(0)
    u = torch.randn(2, 9, 4, generator=gen, dtype=torch.float64)
    h = torch.zeros(2, 6, dtype=torch.float64)
    _, hs = cell(u, h)
    drive = cell.B(u)
    for t in range(9):  # independent loop with relu
        h = torch.relu(h @ cell.A.T + drive[:, t])
        torch.testing.assert_close(hs[:, t], h, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("arch", ["aussm", "mamba3"])
def test_complex_cells_take_any_memory_layout(arch):
    """Inputs at odd storage offsets or with odd strides (which cannot be viewed as complex
    numbers) give the same states as contiguous copies."""
    from dynlab.tracking.models import get_cell

    torch.manual_seed(0)
    cell = get_cell(arch)(5, 3)
    u = torch.randn(1, 4, 5)
    h0 = torch.randn(1, 7)[:, 1:]  # storage offset 1
    y, hs = cell(u, h0)
    y_ref, hs_ref = cell(u, h0.clone())  # a fresh copy at offset 0
    torch.testing.assert_close(hs, hs_ref, rtol=0, atol=0)
    torch.testing.assert_close(y, y_ref, rtol=0, atol=0)
