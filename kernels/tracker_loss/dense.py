"""Fused training loss of a one-layer dense RNN tracker: tokens → cross-entropy, one op.

The model (tanh-rnn, linear-rnn; one layer, linear readout, zero initial state)::

    h_t = phi(h_{t−1} Aᵀ + E[x_t]),   h_{−1} = 0,   phi ∈ {identity, tanh}
    z_t = W h_t + c                    (logits, C classes)
    loss = Σ_{b,t valid} ( logsumexp(z_{b,t}) − z_{b,t}[y_{b,t}] )

where ``E [V, S]`` is the per-token drive (embedding times input projection plus bias,
computed by the caller under autograd, so its gradient flows on to those parameters).
:func:`dense_tracker_loss` returns, per model, the *summed* cross-entropy over valid
positions (labels ≥ 0; −100 marks padding) and the number of positions whose argmax
logit equals the label.  Divide by the number of valid positions for the mean.

Why a fused op: a training step of this model is T small GEMMs forward and T backward,
so on the CPU its cost beyond the GEMMs is memory traffic and per-op overhead.  This
function does the whole step with

- forward: one gather of ``E`` rows into a time-major state buffer ``[T, B, S]``, then
  per step one in-place ``addmm`` and one in-place ``tanh`` on that buffer; the logits
  as one GEMM in class-major layout ``[C, T·B]``, where the softmax over a handful of
  classes is a few contiguous passes (a row-wise ``log_softmax`` over 6 columns is not);
- backward: ∂L/∂z = softmax − one-hot (from the saved probabilities); ∂L/∂W and ∂L/∂c
  as one GEMM and one sum; then the reverse-time loop, per step: the readout term
  ∂L/∂z_t W (a GEMM with K = C), ``+ d_{t+1} A``, ``tanh_backward``, written over h_t in
  the state buffer once h_t is dead, and ∂L/∂A += d_tᵀ h_{t−1} while h_{t−1} is still in
  cache; ∂L/∂E as one ``index_add_`` over the buffer, which now holds the d_t.

No autograd graph per step and one full-size buffer (the states, then their adjoints).
The tracker's accuracy comes out of the same pass (argmax as ``torch.argmax``: the first
maximum wins a tie).

Many models (an ensemble: a leading dimension N on every argument) run together, each
step one batched GEMM for all of them, on every device.  On the CPU a stack is as fast
as running the members one by one on worker threads, one member per core, and faster for
small members, since the per-op overhead is paid once for all members
(``docs/performance.md``).  So there is one code path, and the
intra-op thread count (``torch.set_num_threads``) is the only parallel setting.

:func:`dense_tracker_loss_ref` is the same model as a plain loop under autograd;
the tests compare the two (``tests/kernels/test_tracker_loss_dense.py``).  The front, readout,
cross-entropy, buffer cache and reference loop shared with the gated kernel are in
:mod:`.common`.
"""

from __future__ import annotations

import torch

from ..fast_tanh import tanh_
from ..first_order import first_order
from .common import BUFFERS, fused_call, readout_ce, readout_ce_grad, tracker_loss_ref, table_grad, token_rows

__all__ = ["dense_tracker_loss", "dense_tracker_loss_ref"]


class _DenseTrackerLoss(torch.autograd.Function):
    """Canonical shapes: tokens, labels [N, T, B] (time-major); E [N, V, S]; A [N, S, S];
    W [N, C, S]; c [N, C].  Outputs: loss sums [N], correct counts [N] (no gradient)."""

    @staticmethod
    def forward(ctx, tokens, labels, E, A, W, c, phi):
        rows = token_rows(tokens, E.shape[1])
        loss, correct, hs, probs = _forward(rows, labels, E, A, W, c, phi)
        ctx.bufs = (hs, probs)  # made here and overwritten by backward: plain refs, not saved tensors
        ctx.mark_non_differentiable(correct)
        ctx.phi = phi
        ctx.n_tokens = E.shape[1]
        ctx.save_for_backward(rows, labels, A, W)
        return loss, correct

    @staticmethod
    @first_order("dense_tracker_loss")
    def backward(ctx, grad_loss, _grad_correct):
        rows, labels, A, W = ctx.saved_tensors
        with BUFFERS.lock:  # one backward per graph, even from two threads
            bufs, ctx.bufs = ctx.bufs, None
        if bufs is None:
            raise RuntimeError("dense_tracker_loss: backward through the same graph twice is not supported")
        gE, gA, gW, gc = _backward(rows, labels, A, W, *bufs, grad_loss, ctx.n_tokens, ctx.phi)
        BUFFERS.give(bufs[0])  # the state buffer: nothing refers to it any more
        return None, None, gE, gA, gW, gc, None


def _forward(rows, labels, E, A, W, c, phi):
    """One group of members; returns (loss [N], correct [N], hs [N, T, B, S], probs [N, C, T·B])."""
    n, t_len, bsz = labels.shape
    v, s = E.shape[1], E.shape[2]
    hs = BUFFERS.take((n, t_len, bsz, s), E.dtype, E.device)
    torch.index_select(E.reshape(n * v, s), 0, rows, out=hs.view(-1, s))  # the drive, overwritten by h_t
    _forward_loop(hs, A, phi == "tanh")
    loss, correct, probs = readout_ce(hs, W, c, labels)
    return loss, correct, hs, probs


def _forward_loop(hs: torch.Tensor, A: torch.Tensor, tanh: bool) -> None:
    """In place on ``hs [N, T, B, S]`` (holding the drive): h_t = phi(h_{t−1} Aᵀ + drive_t)."""
    if hs.shape[0] == 1:  # 2-D ops: the CPU path, where per-op overhead is what is left to save
        steps, a = hs[0].unbind(0), A[0].t()
        step = torch.Tensor.addmm_
    else:
        steps, a = hs.unbind(1), A.mT
        step = torch.Tensor.baddbmm_
    prev = None
    for h_t in steps:
        if prev is not None:
            step(h_t, prev, a)
        if tanh:
            tanh_(h_t)  # the C loop of .fast_tanh on float32 CPU states
        prev = h_t


def _backward_loop(hs: torch.Tensor, g: torch.Tensor, W: torch.Tensor, A: torch.Tensor, tanh: bool) -> torch.Tensor:
    """Reverse-time adjoint, in place: ``hs [N, T, B, S]`` (the states) is overwritten
    with d_t = ∂L/∂pre_t = phi'(pre_t) ⊙ (g_t W + d_{t+1} A), last step first, once h_t is no
    longer needed; ``g [N, T, B, C]`` is ∂L/∂z.  Returns ∂L/∂A = Σ_{t≥1} d_tᵀ h_{t−1},
    accumulated step by step while h_{t−1} is still in cache."""
    n, t_len, bsz, s = hs.shape
    if n == 1:
        hss, gs, w, a = hs[0].unbind(0), g[0].unbind(0), W[0], A[0]
        mm, acc, tr = torch.mm, torch.Tensor.addmm_, torch.Tensor.t
        tmp = hs.new_empty(bsz, s)
        gA = hs.new_zeros(s, s)
    else:
        hss, gs, w, a = hs.unbind(1), g.unbind(1), W, A
        mm, acc, tr = torch.bmm, torch.Tensor.baddbmm_, lambda x: x.mT
        tmp = hs.new_empty(n, bsz, s)
        gA = hs.new_zeros(n, s, s)
    tanh_backward = torch.ops.aten.tanh_backward
    for t in range(t_len - 1, -1, -1):
        mm(gs[t], w, out=tmp)  # ∂L/∂h_t from the readout
        if t < t_len - 1:
            acc(tmp, hss[t + 1], a)  # + d_{t+1} A
        if tanh:
            tanh_backward(tmp, hss[t], grad_input=hss[t])
        else:
            hss[t].copy_(tmp)
        if t > 0:
            acc(gA, tr(hss[t]), hss[t - 1])
    return gA if n > 1 else gA[None]


def _backward(rows, labels, A, W, hs, probs, grad_loss, n_tokens, phi):
    n, s = hs.shape[0], hs.shape[-1]
    g_rows, gW, gc = readout_ce_grad(probs, labels, grad_loss, hs)
    gA = _backward_loop(hs, g_rows, W, A, phi == "tanh")  # hs now holds d_t
    return table_grad(rows, hs.view(-1, s), n, n_tokens), gA, gW, gc


def dense_tracker_loss(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    E: torch.Tensor,
    A: torch.Tensor,
    W: torch.Tensor,
    c: torch.Tensor,
    phi: str = "tanh",
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy and correct-count of a one-layer dense RNN tracker (module docstring).

    Args:
        tokens: ``[B, T]`` token ids in ``[0, V)`` (or ``[N, B, T]``, one batch per model).
        labels: like ``tokens``; class ids, or −100 for positions to ignore.
        E: per-token drive ``[V, S]`` (or ``[N, V, S]``).
        A: recurrence ``[S, S]`` (or ``[N, S, S]``).
        W: readout weight ``[C, S]`` (or ``[N, C, S]``).
        c: readout bias ``[C]`` (or ``[N, C]``).
        phi: ``"tanh"`` or ``"identity"``.

    Returns:
        ``(loss, correct)``: the cross-entropy summed over valid positions (nats; a
        scalar, or ``[N]``), differentiable in E, A, W and c (once: no double backward);
        and the number of valid positions whose label has the largest logit (int64, no
        gradient).
    """
    return fused_call(
        "dense tracker", lambda *args: _DenseTrackerLoss.apply(*args, phi), phi, tokens, labels, [E], [A], W, c
    )


def dense_tracker_loss_ref(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    E: torch.Tensor,
    A: torch.Tensor,
    W: torch.Tensor,
    c: torch.Tensor,
    phi: str = "tanh",
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model of :func:`dense_tracker_loss` as a plain loop under autograd (the
    definition the fused op is tested against).  Same arguments and returns."""

    def pre(h, x, tabs, mats):  # h_{t−1} Aᵀ + E[x_t]
        return h @ mats[0].T + tabs[0][x]

    return tracker_loss_ref("dense tracker", pre, phi, tokens, labels, [E], [A], W, c)

