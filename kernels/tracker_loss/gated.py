"""Fused training loss of a one-layer *gated* dense RNN tracker: tokens → cross-entropy.

The model (state-gated-rnn with ``U``, token-gated-rnn without; one layer, linear
readout, zero initial state)::

    a_t = h_{t−1} Aᵀ
    g_t = σ(G[x_t] + h_{t−1} Uᵀ)      (token-gated: g_t = σ(G[x_t]))
    h_t = phi(g_t ⊙ a_t + E[x_t]),     h_{−1} = 0,   phi ∈ {identity, tanh}
    z_t = W h_t + c
    loss = Σ_{b,t valid} ( logsumexp(z_{b,t}) − z_{b,t}[y_{b,t}] )

``E, G [V, S]`` are the per-token drive and gate input (computed by the caller under
autograd).  Returns the summed cross-entropy over valid positions (labels ≥ 0; −100 is
padding) and the argmax hit count, as :func:`dynlab.kernels.tracker_loss.dense.dense_tracker_loss`,
whose layout, readout, loss and batching of many models this kernel shares
(:mod:`.common`).

Per step, forward: one GEMM ``h_{t−1} [Aᵀ | Uᵀ]`` into a buffer ``P_t = [a_t | u_t]``
already holding ``[0 | G[x_t]]``, an in-place sigmoid on its gate half, one ``addcmul``
into the state buffer (which holds ``E[x_t]``) and an in-place tanh.  Backward, last step
first: the readout term and the carried adjoint ``[∂a_{t+1} | ∂u_{t+1}] [A; U]`` (one
GEMM), ``tanh_backward``, then ``∂a_t = d_t ⊙ g_t`` and ``∂u_t = σ'(·) ⊙ d_t ⊙ a_t``
written over ``P_t``, and ``∂[A; U] += [∂a_t | ∂u_t]ᵀ h_{t−1}`` while h_{t−1} is in
cache; ∂E and ∂G as one ``index_add_`` each at the end.

:func:`gated_tracker_loss_ref` is the same model as a plain loop under autograd;
the tests compare the two (``tests/kernels/test_tracker_loss_gated.py``).
"""

from __future__ import annotations

import torch

from ..fast_tanh import tanh_
from ..first_order import first_order
from .common import BUFFERS, fused_call, readout_ce, readout_ce_grad, tracker_loss_ref, table_grad, token_rows

__all__ = ["gated_tracker_loss", "gated_tracker_loss_ref"]


class _GatedTrackerLoss(torch.autograd.Function):
    """Canonical shapes: tokens, labels [N, T, B] (time-major); E, G [N, V, S]; A, U
    [N, S, S] (U may be None); W [N, C, S]; c [N, C].  Outputs: loss sums [N], counts [N]."""

    @staticmethod
    def forward(ctx, tokens, labels, E, G, A, U, W, c, phi):
        rows = token_rows(tokens, E.shape[1])
        loss, correct, *bufs = _forward(rows, labels, E, G, A, U, W, c, phi)
        ctx.bufs = tuple(bufs)  # (hs, P, probs), overwritten by backward: plain refs
        ctx.mark_non_differentiable(correct)
        ctx.phi, ctx.has_u = phi, U is not None
        ctx.n_tokens = E.shape[1]
        ctx.save_for_backward(rows, labels, A, W, U if U is not None else A)
        return loss, correct

    @staticmethod
    @first_order("gated_tracker_loss")
    def backward(ctx, grad_loss, _grad_correct):
        rows, labels, A, W, U = ctx.saved_tensors
        U = U if ctx.has_u else None
        with BUFFERS.lock:  # one backward per graph, even from two threads
            bufs, ctx.bufs = ctx.bufs, None
        if bufs is None:
            raise RuntimeError("gated_tracker_loss: backward through the same graph twice is not supported")
        gE, gG, gA, gU, gW, gc = _backward(rows, labels, A, U, W, *bufs, grad_loss, ctx.n_tokens, ctx.phi)
        BUFFERS.give(bufs[0])  # state and gate buffers: nothing refers to them any more
        BUFFERS.give(bufs[1])
        return None, None, gE, gG, gA, gU, gW, gc, None


def _forward(rows, labels, E, G, A, U, W, c, phi):
    """One group of members: (loss [N], correct [N], hs [N, T, B, S], P [N, T, B, 2S], probs)."""
    n, t_len, bsz = labels.shape
    v, s = E.shape[1], E.shape[2]
    hs = BUFFERS.take((n, t_len, bsz, s), E.dtype, E.device)
    torch.index_select(E.reshape(n * v, s), 0, rows, out=hs.view(-1, s))  # the drive, overwritten by h_t
    table = torch.cat([torch.zeros_like(G), G], dim=-1)  # [N, V, 2S]: P_t starts as [0 | G[x_t]]
    P = BUFFERS.take((n, t_len, bsz, 2 * s), E.dtype, E.device)
    torch.index_select(table.reshape(n * v, 2 * s), 0, rows, out=P.view(-1, 2 * s))
    wcat = torch.cat([A.mT, U.mT], dim=-1) if U is not None else A.mT  # [N, S, 2S] or [N, S, S]
    tanh = phi == "tanh"
    # per-step views made once (slicing inside the loop costs more than the small ops do)
    dim, w = (0, wcat[0]) if n == 1 else (1, wcat)
    src = (hs[0], P[0]) if n == 1 else (hs, P)
    hss, ps = src[0].unbind(dim), src[1].unbind(dim)
    a_s, g_s = src[1][..., :s].unbind(dim), src[1][..., s:].unbind(dim)  # a_t and u_t halves of P_t
    outs = ps if U is not None else a_s  # what the GEMM h_{t−1} [Aᵀ | Uᵀ] writes into
    step = torch.Tensor.addmm_ if n == 1 else torch.Tensor.baddbmm_
    for t in range(t_len):
        if t > 0:
            step(outs[t], hss[t - 1], w)
        gate = g_s[t].sigmoid_()
        h_t = hss[t]
        if t > 0:
            h_t.addcmul_(gate, a_s[t])
        if tanh:
            tanh_(h_t)  # the C loop of .fast_tanh on float32 CPU states
    loss, correct, probs = readout_ce(hs, W, c, labels)
    return loss, correct, hs, P, probs


def _backward(rows, labels, A, U, W, hs, P, probs, grad_loss, n_tokens, phi):
    n, t_len, bsz, s = hs.shape
    g_rows, gW, gc = readout_ce_grad(probs, labels, grad_loss, hs)  # ∂L/∂z [N, T, B, C]
    mcat = torch.cat([A, U], dim=1) if U is not None else A  # [N, 2S, S] or [N, S, S]
    k = mcat.shape[1]
    tanh = phi == "tanh"
    if n == 1:
        dim, src, gsrc, w, m = 0, (hs[0], P[0]), g_rows[0], W[0], mcat[0]
        mm, acc, tr = torch.mm, torch.Tensor.addmm_, torch.Tensor.t
        lam, tmp, gcat = hs.new_empty(bsz, s), hs.new_empty(bsz, s), hs.new_zeros(k, s)
    else:
        dim, src, gsrc, w, m = 1, (hs, P), g_rows, W, mcat
        mm, acc, tr = torch.bmm, torch.Tensor.baddbmm_, lambda x: x.mT
        lam, tmp, gcat = hs.new_empty(n, bsz, s), hs.new_empty(n, bsz, s), hs.new_zeros(n, k, s)
    hss, gs = src[0].unbind(dim), gsrc.unbind(dim)  # per-step views, made once
    a_s, g_s = src[1][..., :s].unbind(dim), src[1][..., s:].unbind(dim)
    ds = src[1].unbind(dim) if U is not None else a_s  # [∂a | ∂u]_t once written (∂a_t alone without U)
    dsT = [tr(x) for x in ds]
    tanh_backward, sigmoid_backward = torch.ops.aten.tanh_backward, torch.ops.aten.sigmoid_backward
    for t in range(t_len - 1, -1, -1):
        mm(gs[t], w, out=lam)  # ∂L/∂h_t from the readout
        if t < t_len - 1:
            acc(lam, ds[t + 1], m)  # + [∂a | ∂u]_{t+1} [A; U]
        h_t, a_t, g_t = hss[t], a_s[t], g_s[t]
        if tanh:
            tanh_backward(lam, h_t, grad_input=h_t)  # d_t = ∂L/∂pre_t, over h_t
        else:
            h_t.copy_(lam)
        torch.mul(h_t, a_t, out=tmp)  # ∂L/∂g_t
        torch.mul(h_t, g_t, out=a_t)  # ∂L/∂a_t, over a_t
        sigmoid_backward(tmp, g_t, grad_input=g_t)  # ∂L/∂u_t, over g_t
        if t > 0:
            acc(gcat, dsT[t], hss[t - 1])  # ∂[A; U] += [∂a | ∂u]ᵀ h_{t−1}
    gA, gU = (gcat[..., :s, :], gcat[..., s:, :]) if U is not None else (gcat, None)
    if n == 1:
        gA, gU = gA[None], None if gU is None else gU[None]
    gE = table_grad(rows, hs.view(-1, s), n, n_tokens)  # hs holds d_t
    gG = table_grad(rows, P[..., s:].reshape(-1, s), n, n_tokens)  # the gate half of P holds ∂u_t
    return gE, gG, gA, gU, gW, gc


def gated_tracker_loss(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    E: torch.Tensor,
    G: torch.Tensor,
    A: torch.Tensor,
    U: torch.Tensor | None,
    W: torch.Tensor,
    c: torch.Tensor,
    phi: str = "tanh",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy and correct-count of a one-layer gated dense RNN tracker.

    Args:
        tokens: ``[B, T]`` token ids in ``[0, V)`` (or ``[N, B, T]``, one batch per model).
        labels: like ``tokens``; class ids, or −100 for positions to ignore.
        E: per-token drive ``[V, S]`` (or ``[N, V, S]``).
        G: per-token gate input ``[V, S]`` (or ``[N, V, S]``).
        A: recurrence ``[S, S]`` (or ``[N, S, S]``).
        U: state-to-gate matrix ``[S, S]`` (or ``[N, S, S]``); None for a token-only gate.
        W: readout weight ``[C, S]`` (or ``[N, C, S]``).
        c: readout bias ``[C]`` (or ``[N, C]``).
        phi: ``"tanh"`` or ``"identity"``.

    Returns:
        ``(loss, correct)``: cross-entropy summed over valid positions (nats; a scalar, or
        ``[N]``), differentiable in E, G, A, U, W and c (once); and the count of valid
        positions whose label has the largest logit (int64, no gradient).
    """
    return fused_call(
        "gated tracker", lambda *args: _GatedTrackerLoss.apply(*args, phi), phi, tokens, labels, [E, G], [A, U], W, c
    )


def gated_tracker_loss_ref(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    E: torch.Tensor,
    G: torch.Tensor,
    A: torch.Tensor,
    U: torch.Tensor | None,
    W: torch.Tensor,
    c: torch.Tensor,
    phi: str = "tanh",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model of :func:`gated_tracker_loss` as a plain loop under autograd (the
    definition the fused op is tested against).  Same arguments and returns."""

    def pre(h, x, tabs, mats):  # σ(G[x_t] + h_{t−1} Uᵀ) ⊙ (h_{t−1} Aᵀ) + E[x_t]
        (E_m, G_m), (A_m, U_m) = tabs, mats
        gate_in = G_m[x] + (h @ U_m.T if U_m is not None else 0.0)
        return torch.sigmoid(gate_in) * (h @ A_m.T) + E_m[x]

    return tracker_loss_ref("gated tracker", pre, phi, tokens, labels, [E, G], [A, U], W, c)
