"""The fused gated-tracker loss equals the gated cells written with plain autograd."""

from __future__ import annotations

import pytest
import torch

from dynlab.kernels.tracker_loss.gated import gated_tracker_loss, gated_tracker_loss_ref

D = torch.float64


def _problem(n=3, b=5, t=7, v=4, s=8, c=5, seed=0, state_gate=True):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, v, (n, b, t), generator=g)
    lab = torch.randint(0, c, (n, b, t), generator=g)
    lab[-1, :, t // 2 :] = -100  # a member padded after its own length
    E = torch.randn(n, v, s, generator=g, dtype=D)
    G = torch.randn(n, v, s, generator=g, dtype=D)
    A = torch.randn(n, s, s, generator=g, dtype=D) * 0.4
    U = torch.randn(n, s, s, generator=g, dtype=D) * 0.4 if state_gate else None
    W = torch.randn(n, c, s, generator=g, dtype=D)
    cb = torch.randn(n, c, generator=g, dtype=D)
    params = [x.requires_grad_() for x in (E, G, A, W, cb)]
    if U is not None:
        U.requires_grad_()
    return tok, lab, params, U


@pytest.mark.parametrize("state_gate", [True, False])
@pytest.mark.parametrize("phi", ["tanh", "identity"])
def test_gated_loss_and_gradients_match_autograd(state_gate, phi):
    tok, lab, (E, G, A, W, cb), U = _problem(state_gate=state_gate)
    leaves = [E, G, A, W, cb] + ([U] if U is not None else [])
    weights = torch.tensor([0.5, 1.0, -1.5], dtype=D)
    loss, hits = gated_tracker_loss(tok, lab, E, G, A, U, W, cb, phi=phi)
    got = torch.autograd.grad((loss * weights).sum(), leaves)
    ref, ref_hits = gated_tracker_loss_ref(tok, lab, E, G, A, U, W, cb, phi)
    want = torch.autograd.grad((ref * weights).sum(), leaves)
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    assert hits.tolist() == ref_hits.tolist()
    for name, a, b in zip(["E", "G", "A", "W", "c", "U"], got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_single_model_and_bad_input():
    tok, lab, (E, G, A, W, cb), U = _problem(n=1)
    loss, hits = gated_tracker_loss(tok[0], lab[0], E[0], G[0], A[0], U[0], W[0], cb[0])
    ref, ref_hits = gated_tracker_loss_ref(tok, lab, E, G, A, U, W, cb, "tanh")
    torch.testing.assert_close(loss, ref[0], rtol=1e-12, atol=1e-12)
    assert int(hits) == int(ref_hits[0])
    with pytest.raises(ValueError, match="unknown phi"):
        gated_tracker_loss(tok, lab, E, G, A, U, W, cb, phi="relu")
    with pytest.raises(ValueError, match="one N, S and C"):
        gated_tracker_loss(tok, lab, E, G, A, U[..., :4], W, cb)


def test_gated_backward_once_and_first_order_only():
    tok, lab, (E, G, A, W, cb), U = _problem()
    loss, _ = gated_tracker_loss(tok, lab, E, G, A, U, W, cb)
    loss.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward through the same graph twice"):
        loss.sum().backward()
    loss, _ = gated_tracker_loss(tok, lab, E, G, A, U, W, cb)
    with pytest.raises(RuntimeError, match="first derivatives only"):
        torch.autograd.grad(loss.sum(), [A], create_graph=True)


@pytest.mark.parametrize("state_gate", [True, False])
def test_no_unwritten_memory_is_read(nan_buffers, state_gate):
    tok, lab, (E, G, A, W, cb), U = _problem(state_gate=state_gate)
    leaves = [E, G, A, W, cb] + ([U] if U is not None else [])
    ref, ref_hits = gated_tracker_loss_ref(tok, lab, E, G, A, U, W, cb)
    want = torch.autograd.grad(ref.sum(), leaves)
    nan_buffers()
    for _ in range(2):  # the second pass runs on buffers handed back by the first
        loss, hits = gated_tracker_loss(tok, lab, E, G, A, U, W, cb)
        torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
        assert hits.tolist() == ref_hits.tolist()
        for a, b in zip(torch.autograd.grad(loss.sum(), leaves), want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)
