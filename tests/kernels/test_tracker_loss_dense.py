"""The fused dense-tracker loss equals the same model written with plain autograd."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynlab.kernels.tracker_loss.dense import dense_tracker_loss, dense_tracker_loss_ref
from dynlab.kernels.tracker_loss.common import BUFFERS
from dynlab.tracking.models import Tracker
from dynlab.tracking.models.cells import StateGatedRNNCell, TanhRNNCell
from dynlab.tracking.train.engine import fused_kind, tracker_logits, tracker_loss

D = torch.float64


def _problem(n=3, b=5, t=7, v=4, s=8, c=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    tok = torch.randint(0, v, (n, b, t), generator=g)
    lab = torch.randint(0, c, (n, b, t), generator=g)
    if n > 2:
        lab[1, :, 5:] = -100  # padding, as an ensemble member with a shorter curriculum has
        lab[2, 0, :] = -100
    else:
        lab[0, 1, 3:] = -100
    E = torch.randn(n, v, s, generator=g, dtype=D)
    A = torch.randn(n, s, s, generator=g, dtype=D) * 0.4
    W = torch.randn(n, c, s, generator=g, dtype=D)
    cb = torch.randn(n, c, generator=g, dtype=D)
    return tok, lab, [x.requires_grad_() for x in (E, A, W, cb)]


@pytest.mark.parametrize("phi", ["tanh", "identity"])
def test_fused_loss_and_gradients_match_autograd(phi):
    tok, lab, params = _problem()
    weights = torch.tensor([1.0, -2.0, 0.5], dtype=D)  # a non-uniform upstream gradient per model
    loss, hits = dense_tracker_loss(tok, lab, *params, phi=phi)
    got = torch.autograd.grad((loss * weights).sum(), params)
    ref_loss, ref_hits = dense_tracker_loss_ref(tok, lab, *params, phi)
    want = torch.autograd.grad((ref_loss * weights).sum(), params)
    torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
    assert hits.tolist() == ref_hits.tolist()
    for name, a, b in zip("E A W c".split(), got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_single_model_shapes_and_tie_rule():
    """Unbatched call; exact logit ties resolve to the first class, as torch.argmax."""
    tok = torch.tensor([[0, 1, 0]])
    lab = torch.tensor([[1, 0, 1]])
    E = torch.ones(2, 3, dtype=D)
    A = torch.zeros(3, 3, dtype=D)
    W = torch.zeros(2, 3, dtype=D)  # every logit 0: all tied, argmax = class 0
    cb = torch.zeros(2, dtype=D)
    loss, hits = dense_tracker_loss(tok, lab, E, A, W, cb)
    assert loss.shape == () and int(hits) == 1  # only the label-0 position counts
    assert float(loss) == pytest.approx(3 * torch.log(torch.tensor(2.0)).item())


def test_stacked_models_equal_each_model_alone_and_reruns_are_bit_identical():
    tok, lab, params = _problem(n=4, b=16, t=12, s=16, seed=3)
    p32 = [p.detach().float().requires_grad_() for p in params]
    loss, hits = dense_tracker_loss(tok, lab, *p32)
    grads = torch.autograd.grad(loss.sum(), p32)
    for i in range(4):
        one = [p[i].detach().requires_grad_() for p in p32]
        l1, h1 = dense_tracker_loss(tok[i], lab[i], *one)
        torch.testing.assert_close(l1, loss[i], rtol=1e-5, atol=1e-5)
        assert int(h1) == int(hits[i])
        for a, b in zip(torch.autograd.grad(l1, one), grads):
            torch.testing.assert_close(a, b[i], rtol=1e-4, atol=1e-5)
    again = torch.autograd.grad(dense_tracker_loss(tok, lab, *p32)[0].sum(), p32)
    assert all(torch.equal(a, b) for a, b in zip(again, grads))


def test_bad_input_is_refused():
    tok, lab, (E, A, W, cb) = _problem()
    with pytest.raises(ValueError, match="unknown phi 'relu'.*allowed: identity, tanh"):
        dense_tracker_loss(tok, lab, E, A, W, cb, phi="relu")
    with pytest.raises(ValueError, match=r"expected tokens/labels \[N, B, T\].*got"):
        dense_tracker_loss(tok, lab, E[..., :4], A, W, cb)
    with pytest.raises(ValueError, match=r"expected tokens/labels \[N, B, T\]"):
        dense_tracker_loss(tok, lab[:, :2], E, A, W, cb)
    with pytest.raises(ValueError, match=r"one N, S and C"):
        dense_tracker_loss(tok, lab, E, A[:2], W, cb)  # two recurrences for three models
    with pytest.raises(ValueError, match=r"token ids must lie in \[0, 4\); got 0\.\.4"):
        dense_tracker_loss(tok.clamp(max=4) + (tok == 3).long(), lab, E, A, W, cb)


def test_backward_twice_and_double_backward_are_refused():
    tok, lab, params = _problem()
    loss, _ = dense_tracker_loss(tok, lab, *params)
    loss.sum().backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward through the same graph twice"):
        loss.sum().backward()
    loss, _ = dense_tracker_loss(tok, lab, *params)
    with pytest.raises(RuntimeError, match="first derivatives only"):  # no silent second-order gradient
        torch.autograd.grad(loss.sum(), params, create_graph=True)


@pytest.mark.parametrize(
    "arch, phi",
    [("tanh-rnn", None), ("linear-rnn", None), ("linear-rnn", "tanh"), ("token-gated-rnn", None),
     ("token-gated-rnn", "tanh"), ("state-gated-rnn", None), ("state-gated-rnn", "identity")],
)
def test_tracker_loss_matches_logits_path(arch, phi):
    """``tracker_loss`` (fused) equals cross-entropy of ``tracker_logits``, value and gradients."""
    torch.manual_seed(0)
    model = Tracker(arch, 6, 6, hidden=10, nonlinearity=phi, d_embed=7).double()
    assert fused_kind(model) is not None
    tokens = torch.randint(0, 6, (7, 9))
    labels = torch.randint(0, 6, (7, 9))
    loss, acc = tracker_loss(model, tokens, labels)
    got = torch.autograd.grad(loss, list(model.parameters()))
    logits = tracker_logits(model, tokens)
    ref = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    want = torch.autograd.grad(ref, list(model.parameters()))
    torch.testing.assert_close(loss, ref, rtol=1e-12, atol=1e-12)
    assert float(acc) == pytest.approx(float((logits.argmax(-1) == labels).double().mean()))
    for (name, _), a, b in zip(model.named_parameters(), got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)


def test_fused_path_only_for_the_models_it_implements():
    kinds = {
        arch: fused_kind(Tracker(arch, 4, 4, hidden=8))
        for arch in ("tanh-rnn", "linear-rnn", "token-gated-rnn", "state-gated-rnn", "mamba", "aussm")
    }
    assert kinds == {
        "tanh-rnn": "dense", "linear-rnn": "dense", "token-gated-rnn": "token-gated",
        "state-gated-rnn": "state-gated", "mamba": "diagonal", "aussm": "diagonal-aussm",
    }
    assert fused_kind(Tracker("mamba", 4, 4, hidden=8, nonlinearity="tanh")) is None  # the diagonal kernel is linear
    assert fused_kind(Tracker("tanh-rnn", 4, 4, hidden=8, layers=2)) is None
    assert fused_kind(Tracker("tanh-rnn", 4, 4, hidden=8, readout="mlp")) is None
    assert fused_kind(Tracker("tanh-rnn", 4, 4, hidden=8, nonlinearity="relu")) is None
    assert fused_kind(Tracker("state-gated-rnn", 4, 4, hidden=8, nonlinearity="relu")) is None
    assert fused_kind(Tracker("token-gated-rnn", 4, 4, hidden=8, nonlinearity="tanh")) == "token-gated"

    class Custom(TanhRNNCell):  # a user's variant with its own transition: not the fused model
        def transition(self, h, p):
            return torch.tanh(2 * self._ah(h) + p["drive"])

    class CustomGate(StateGatedRNNCell):
        def precompute(self, u):
            return {"gate_in": 2 * self.W_g(u), "drive": self.B(u)}

    for cell in (Custom(8, 8), CustomGate(8, 8)):
        model = Tracker("tanh-rnn", 4, 4, hidden=8)
        model.cells[0] = cell
        assert fused_kind(model) is None


def test_tracker_loss_ignores_padding_like_cross_entropy():
    torch.manual_seed(1)
    model = Tracker("tanh-rnn", 6, 6, hidden=10).double()
    tokens = torch.randint(0, 6, (4, 8))
    labels = torch.randint(0, 6, (4, 8))
    labels[:, 5:] = -100
    loss, acc = tracker_loss(model, tokens, labels)
    logits = tracker_logits(model, tokens)
    torch.testing.assert_close(loss, F.cross_entropy(logits.flatten(0, 1), labels.flatten()))
    valid = labels != -100
    assert float(acc) == pytest.approx(float(((logits.argmax(-1) == labels) & valid).sum() / valid.sum()))


def test_fused_kind_refuses_overrides_the_kernel_would_ignore():
    from torch import nn

    class OwnReadout(TanhRNNCell):
        def readout(self, hs, p):
            return torch.nn.functional.layer_norm(hs, hs.shape[-1:])

    class NoBias(TanhRNNCell):
        def __init__(self, d_in, hidden, **kw):
            super().__init__(d_in, hidden, **kw)
            self.B = nn.Linear(d_in, hidden, bias=False)

    class OwnStart(Tracker):
        def init_state(self, batch, device=None, dtype=None):
            return torch.ones(batch, self.state_size, device=device, dtype=dtype)

    for cell in (OwnReadout(8, 8), NoBias(8, 8)):
        model = Tracker("tanh-rnn", 4, 4, hidden=8)
        model.cells[0] = cell
        assert fused_kind(model) is None
    assert fused_kind(OwnStart("tanh-rnn", 4, 4, hidden=8)) is None


def test_reused_state_buffers_never_alias_a_live_graph():
    """Buffers go back to the cache only after backward; interleaved graphs stay correct."""
    tok, lab, params = _problem(n=2, b=6, t=5)
    p32 = [p.detach().float().requires_grad_() for p in params]
    ref = [torch.autograd.grad(dense_tracker_loss(tok, lab, *p32)[0].sum(), p32) for _ in range(2)]
    BUFFERS.clear()
    first, _ = dense_tracker_loss(tok, lab, *p32)
    warm, _ = dense_tracker_loss(tok, lab, *p32)
    torch.autograd.grad(warm.sum(), p32)  # gives its buffer back: the next forward takes it
    second, _ = dense_tracker_loss(tok, lab, *p32)
    for graph in (first, second):
        for a, b in zip(torch.autograd.grad(graph.sum(), p32), ref[0]):
            assert torch.equal(a, b)


@pytest.mark.parametrize("phi", ["tanh", "identity"])
def test_no_unwritten_memory_is_read(nan_buffers, phi):
    tok, lab, params = _problem()
    ref_loss, ref_hits = dense_tracker_loss_ref(tok, lab, *params, phi)
    want = torch.autograd.grad(ref_loss.sum(), params)
    nan_buffers()
    for _ in range(2):  # the second pass runs on buffers handed back by the first
        loss, hits = dense_tracker_loss(tok, lab, *params, phi=phi)
        got = torch.autograd.grad(loss.sum(), params)
        torch.testing.assert_close(loss, ref_loss, rtol=1e-12, atol=1e-12)
        assert hits.tolist() == ref_hits.tolist()
        for a, b in zip(got, want):
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12)


def test_empty_batch_or_length_gives_zero():
    tok, lab, params = _problem()
    for sl in (slice(0, 0), slice(None)):
        t, y = tok[:, sl], lab[:, sl]
        if sl == slice(None):
            t, y = tok[..., :0], lab[..., :0]
        loss, hits = dense_tracker_loss(t, y, *params)
        assert loss.tolist() == [0.0, 0.0, 0.0] and hits.tolist() == [0, 0, 0]
