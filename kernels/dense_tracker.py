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

Many models (an ensemble, leading dimension N on every argument) run either batched
(``bmm``, the default off the CPU) or one by one (the CPU default), optionally on
``workers`` threads, one model per thread and one intra-op thread each.  On the 2-core
development box, at H=128, B=256, T=60, two stacked members took 2.3× the time of one
(the stacked buffers fall out of cache), while two members on two worker threads took
0.7× the time of running them one after the other (measured in one run; the box's
2-thread GEMM rate is itself only 1.5× its 1-thread rate).

Tested against the same model written with plain autograd (``tests/test_dense_tracker.py``).
"""

from __future__ import annotations

import math
import os
from concurrent.futures import ThreadPoolExecutor

import torch

__all__ = ["dense_tracker_loss"]

PHIS = ("identity", "tanh")


class _DenseTrackerLoss(torch.autograd.Function):
    """Canonical shapes: tokens, labels [N, T, B] (time-major); E [N, V, S]; A [N, S, S];
    W [N, C, S]; c [N, C].  Outputs: loss sums [N], correct counts [N] (no gradient)."""

    @staticmethod
    def forward(ctx, tokens, labels, E, A, W, c, phi, workers, batched):
        n, _, bsz = tokens.shape
        items = None if batched else _pieces(n, bsz, workers)
        if items is None or len(items) == 1:
            loss, correct, hs, probs = _forward(tokens, labels, E, A, W, c, phi)
            ctx.hs, ctx.probs = [hs], [probs]
        else:

            def one(item):
                i, rows = item
                m = slice(i, i + 1)
                return _forward(tokens[m, :, rows], labels[m, :, rows], E[m], A[m], W[m], c[m], phi)

            outs = _map(one, items, workers)
            loss = _sum_pieces([o[0] for o in outs], items, n)
            correct = _sum_pieces([o[1] for o in outs], items, n)
            ctx.hs, ctx.probs = [o[2] for o in outs], [o[3] for o in outs]
        ctx.mark_non_differentiable(correct)
        ctx.phi, ctx.workers, ctx.items = phi, workers, items
        ctx.n_tokens = E.shape[1]
        ctx.save_for_backward(tokens, labels, A, W)
        return loss, correct

    @staticmethod
    def backward(ctx, grad_loss, _grad_correct):
        tokens, labels, A, W = ctx.saved_tensors
        hs, probs = ctx.hs, ctx.probs
        ctx.hs = ctx.probs = None  # the buffers are reused in place below; one backward only
        if hs is None:
            raise RuntimeError("dense_tracker_loss: backward through the same graph twice is not supported")
        items, n = ctx.items, tokens.shape[0]
        if len(hs) == 1:
            gE, gA, gW, gc = _backward(tokens, labels, A, W, hs[0], probs[0], grad_loss, ctx.n_tokens, ctx.phi)
        else:

            def one(k: int):
                i, rows = items[k]
                m = slice(i, i + 1)
                return _backward(
                    tokens[m, :, rows], labels[m, :, rows], A[m], W[m], hs[k], probs[k], grad_loss[m],
                    ctx.n_tokens, ctx.phi,
                )

            parts = _map(one, range(len(items)), ctx.workers)
            gE, gA, gW, gc = (_sum_pieces(list(p), items, n) for p in zip(*parts))
        return None, None, gE, gA, gW, gc, None, None, None


def _pieces(n: int, bsz: int, workers: int) -> list[tuple[int, slice]]:
    """Work items (model, batch rows) for the one-by-one mode: each model whole, unless
    that leaves workers idle (N not a multiple of ``workers``); then each model's batch is
    cut into ``workers / gcd(N, workers)`` row blocks, so the items share out evenly.
    The loss is a sum over rows, so the blocks' losses and gradients add up to the model's."""
    per = 1 if workers <= 1 else workers // math.gcd(n, workers)
    per = max(1, min(per, bsz))
    cuts = [round(k * bsz / per) for k in range(per + 1)]
    return [(i, slice(cuts[k], cuts[k + 1])) for i in range(n) for k in range(per)]


def _sum_pieces(values: list[torch.Tensor], items: list[tuple[int, slice]], n: int) -> torch.Tensor:
    """Per-model sums ``[N, …]`` of the per-item values ``[1, …]`` (items in model order)."""
    per = len(items) // n
    if per == 1:
        return torch.cat(values)
    return torch.cat([sum(values[i * per + 1 : (i + 1) * per], values[i * per]) for i in range(n)])


_POOL: ThreadPoolExecutor | None = None
_POOL_PID = 0  # the process that made _POOL: a forked child has no threads behind it


def _map(fn, items, workers: int) -> list:
    """``[fn(i) for i in items]``, on up to ``workers`` threads (ATen ops release the GIL)."""
    items = list(items)
    if workers <= 1 or len(items) <= 1:
        return [fn(i) for i in items]
    global _POOL, _POOL_PID
    if _POOL is None or _POOL._max_workers != workers or _POOL_PID != os.getpid():
        if _POOL is not None and _POOL_PID == os.getpid():
            _POOL.shutdown(wait=False)
        _POOL = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="dynlab-dense")
        _POOL_PID = os.getpid()

    def run(i):
        torch.set_num_threads(1)  # this worker's own intra-op setting: one core per member
        with torch.no_grad():  # grad mode is per thread; the autograd Function runs without it
            return fn(i)

    futures = [_POOL.submit(run, i) for i in items]
    return [f.result() for f in futures]


def _forward(tokens, labels, E, A, W, c, phi):
    """One group of members; returns (loss [N], correct [N], hs [N, T, B, S], probs [N, C, T·B])."""
    n, t_len, bsz = tokens.shape
    v, s = E.shape[1], E.shape[2]
    rows = t_len * bsz
    flat = (tokens + (torch.arange(n, device=tokens.device) * v).view(n, 1, 1)).reshape(-1)
    hs = torch.index_select(E.reshape(n * v, s), 0, flat).view(n, t_len, bsz, s)  # drive
    _forward_loop(hs, A, phi == "tanh")
    z = torch.baddbmm(c[:, :, None], W, hs.view(n, rows, s).mT)  # logits [N, C, T·B]
    lab = labels.reshape(n, 1, rows)
    valid = lab[:, 0] >= 0  # [N, T·B]
    safe = lab.clamp(min=0)
    zmax = z.amax(1, keepdim=True)  # [N, 1, T·B]
    z_y = z.gather(1, safe)  # [N, 1, T·B]
    correct = _argmax_hits(z, z_y, zmax, lab, valid).sum(1)
    probs = z.sub_(zmax).exp_()  # in place: z is not needed after this
    total = probs.sum(1, keepdim=True)
    probs.div_(total)
    nll = (total.log_() + zmax - z_y)[:, 0]  # [N, T·B]
    loss = torch.where(valid, nll, 0.0).sum(1)
    return loss, correct, hs, probs


def _forward_loop(hs: torch.Tensor, A: torch.Tensor, tanh: bool) -> None:
    """In place on ``hs [N, T, B, S]`` (holding the drive): h_t = phi(h_{t−1} Aᵀ + drive_t)."""
    if hs.shape[0] == 1:  # 2-D ops: the CPU path, where per-op overhead is what is left to save
        steps, a = hs[0].unbind(0), A[0].t()
        step, act = torch.Tensor.addmm_, torch.Tensor.tanh_
    else:
        steps, a = hs.unbind(1), A.mT
        step, act = torch.Tensor.baddbmm_, torch.Tensor.tanh_
    prev = None
    for h_t in steps:
        if prev is not None:
            step(h_t, prev, a)
        if tanh:
            act(h_t)
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


def _argmax_hits(z, z_y, zmax, lab, valid):
    """``argmax_k z[:, k] == label`` at valid positions ``[N, T·B]``, as ``torch.argmax``
    (the first maximum wins a tie), without a slow arg-reduction over the short class
    axis: the label's logit equals the maximum, and exact ties are resolved one by one."""
    hit = (z_y == zmax)[:, 0] & valid
    tied = hit & ((z == zmax).sum(1) > 1)
    if bool(tied.any()):
        cols = z.mT[tied]  # [K, C]
        hit[tied] = cols.argmax(-1) == lab[:, 0][tied]
    return hit


def _backward(tokens, labels, A, W, hs, probs, grad_loss, n_tokens, phi):
    n, t_len, bsz, s = hs.shape
    rows = t_len * bsz
    lab = labels.reshape(n, 1, rows)
    valid = lab >= 0
    g = probs  # reuse: ∂L/∂z = (softmax − onehot) · valid · grad_loss
    g.scatter_add_(1, lab.clamp(min=0), torch.full_like(g[:, :1], -1.0))
    g.mul_(torch.where(valid, grad_loss.view(n, 1, 1).to(g.dtype), 0.0))
    gc = g.sum(2)  # [N, C]
    h_rows = hs.view(n, rows, s)
    gW = torch.bmm(g, h_rows)  # [N, C, S]
    g_rows = g.mT.contiguous()  # [N, T·B, C], row-major: the per-step readout term is a K = C GEMM
    gA = _backward_loop(hs, g_rows.view(n, t_len, bsz, -1), W, A, phi == "tanh")  # hs now holds d_t
    flat = (tokens + (torch.arange(n, device=tokens.device) * n_tokens).view(n, 1, 1)).reshape(-1)
    gE = torch.zeros(n * n_tokens, s, dtype=hs.dtype, device=hs.device).index_add_(0, flat, hs.view(-1, s))
    return gE.view(n, n_tokens, s), gA, gW, gc


def dense_tracker_loss(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    E: torch.Tensor,
    A: torch.Tensor,
    W: torch.Tensor,
    c: torch.Tensor,
    phi: str = "tanh",
    workers: int = 1,
    batched: bool | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy and correct-count of a one-layer dense RNN tracker (module docstring).

    Args:
        tokens: ``[B, T]`` token ids (or ``[N, B, T]``, one batch per model).
        labels: like ``tokens``; class ids, or −100 for positions to ignore.
        E: per-token drive ``[V, S]`` (or ``[N, V, S]``).
        A: recurrence ``[S, S]`` (or ``[N, S, S]``).
        W: readout weight ``[C, S]`` (or ``[N, C, S]``).
        c: readout bias ``[C]`` (or ``[N, C]``).
        phi: ``"tanh"`` or ``"identity"``.
        workers: with N models run one by one (``batched`` False), how many run at once,
            each on its own thread with one intra-op thread (1: all on the caller's thread).
        batched: run the N models together as batched GEMMs (True) or one by one
            (False); None: batched except on the CPU.  Both give the same numbers.

    Returns:
        ``(loss, correct)``: the cross-entropy summed over valid positions (nats; a
        scalar, or ``[N]``), differentiable in E, A, W and c; and the number of valid
        positions whose label has the largest logit (int64, no gradient).
    """
    if phi not in PHIS:
        raise ValueError(f"unknown phi {phi!r} for the dense tracker loss; allowed: {', '.join(PHIS)}")
    single = A.dim() == 2
    if single:
        tokens, labels, E, A, W, c = (x[None] for x in (tokens, labels, E, A, W, c))
    if tokens.dim() != 3 or labels.shape != tokens.shape or E.dim() != 3 or A.dim() != 3 or W.dim() != 3 or c.dim() != 2:
        shapes = ", ".join(str(tuple(x.shape)) for x in (tokens, labels, E, A, W, c))
        raise ValueError(f"expected tokens/labels [N, B, T], E [N, V, S], A [N, S, S], W [N, C, S], c [N, C]; got {shapes}")
    n, _, t_len = tokens.shape
    s = A.shape[-1]
    if E.shape[-1] != s or W.shape[-1] != s or A.shape[-2] != s or c.shape[-1] != W.shape[-2]:
        shapes = ", ".join(str(tuple(x.shape)) for x in (E, A, W, c))
        raise ValueError(f"inconsistent state/class sizes in E, A, W, c: {shapes}")
    if t_len == 0:
        zero = E.sum() * 0.0 + A.sum() * 0.0 + W.sum() * 0.0 + c.sum() * 0.0
        out = zero.expand(n).clone(), torch.zeros(n, dtype=torch.long, device=tokens.device)
        return (out[0][0], out[1][0]) if single else out
    tok_tm = tokens.transpose(1, 2).contiguous()  # [N, T, B]
    lab_tm = labels.transpose(1, 2).contiguous()
    dtype = torch.promote_types(torch.promote_types(E.dtype, A.dtype), W.dtype)
    E, A, W, c = (x.to(dtype).contiguous() for x in (E, A, W, c))
    if batched is None:
        batched = tokens.device.type != "cpu"
    loss, correct = _DenseTrackerLoss.apply(tok_tm, lab_tm, E, A, W, c, phi, max(1, int(workers)), bool(batched))
    return (loss[0], correct[0]) if single else (loss, correct)
