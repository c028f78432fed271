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
step one batched GEMM for all of them, on every device.  On the 2-core development box
(H=128, B=256, T=60, two intra-op threads) 16 stacked members took 234 ms per step, the
same as running them one by one on two worker threads, one member per core (234 ms,
measured in one run); for small members (H=64, B=128) the stack was 2× faster, since the
per-op overhead is paid once for all members.  So there is one code path, and the
intra-op thread count (``torch.set_num_threads``) is the only parallel setting.

:func:`dense_tracker_loss_reference` is the same model as a plain loop under autograd;
the tests compare the two (``tests/test_dense_tracker.py``).
"""

from __future__ import annotations

import threading

import torch

__all__ = ["BUFFERS", "check_shapes", "dense_tracker_loss", "dense_tracker_loss_reference", "fused_call", "reference_call"]

PHIS = ("identity", "tanh")


class _BufferCache:
    """Large CPU scratch buffers handed back by a finished backward pass, for the next step.

    The state buffer of a training step is N·T·B·S floats (126 MB for 16 models at H=128,
    B=256, T=60).  A fresh allocation of that size is a fresh ``mmap`` whose pages fault in
    on first touch, about 12% of an ensemble step on the 2-core box (measured by letting
    the allocator keep freed memory).  Only buffers a backward pass has finished with are
    kept, one per shape and dtype, at most ``keep`` shapes (a curriculum changes T); a
    forward pass that finds none allocates.  CUDA has its own caching allocator: not used
    there.
    """

    def __init__(self, keep: int = 4):
        self.keep = keep
        self._free: dict[tuple, torch.Tensor] = {}
        self.lock = threading.Lock()

    def take(self, shape: tuple[int, ...], dtype: torch.dtype, device: torch.device) -> torch.Tensor:
        if device.type == "cpu":
            with self.lock:
                buf = self._free.pop((shape, dtype), None)
            if buf is not None:
                return buf
        return torch.empty(shape, dtype=dtype, device=device)

    def give(self, buf: torch.Tensor) -> None:
        if buf.device.type != "cpu" or not buf.is_contiguous():
            return
        with self.lock:
            self._free[(tuple(buf.shape), buf.dtype)] = buf
            while len(self._free) > self.keep:
                self._free.pop(next(iter(self._free)))

    def clear(self) -> None:
        with self.lock:
            self._free.clear()


BUFFERS = _BufferCache()


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
    def backward(ctx, grad_loss, _grad_correct):
        if torch.is_grad_enabled():  # create_graph=True: a second derivative is not implemented
            raise RuntimeError("dense_tracker_loss: first derivatives only (create_graph / double backward is not supported)")
        rows, labels, A, W = ctx.saved_tensors
        with BUFFERS.lock:  # one backward per graph, even from two threads
            bufs, ctx.bufs = ctx.bufs, None
        if bufs is None:
            raise RuntimeError("dense_tracker_loss: backward through the same graph twice is not supported")
        gE, gA, gW, gc = _backward(rows, labels, A, W, *bufs, grad_loss, ctx.n_tokens, ctx.phi)
        BUFFERS.give(bufs[0])  # the state buffer: nothing refers to it any more
        return None, None, gE, gA, gW, gc, None


def token_rows(tokens: torch.Tensor, n_tokens: int) -> torch.Tensor:
    """Row of each token of ``tokens [N, T, B]`` in the stacked tables ``[N·V, …]``:
    ``n·V + x``, flattened to ``[N·T·B]`` (the gather index forward, the scatter index
    backward)."""
    n = tokens.shape[0]
    return (tokens + (torch.arange(n, device=tokens.device) * n_tokens).view(n, 1, 1)).reshape(-1)


def table_grad(rows: torch.Tensor, values: torch.Tensor, n: int, n_tokens: int) -> torch.Tensor:
    """∂L/∂table ``[N, V, S]`` from the per-position gradients ``values [N·T·B, S]`` gathered
    at ``rows`` (:func:`token_rows`): one ``index_add_``."""
    s = values.shape[-1]
    out = torch.zeros(n * n_tokens, s, dtype=values.dtype, device=values.device)
    return out.index_add_(0, rows, values).view(n, n_tokens, s)


def _forward(rows, labels, E, A, W, c, phi):
    """One group of members; returns (loss [N], correct [N], hs [N, T, B, S], probs [N, C, T·B])."""
    n, t_len, bsz = labels.shape
    v, s = E.shape[1], E.shape[2]
    hs = BUFFERS.take((n, t_len, bsz, s), E.dtype, E.device)
    torch.index_select(E.reshape(n * v, s), 0, rows, out=hs.view(-1, s))  # the drive, overwritten by h_t
    _forward_loop(hs, A, phi == "tanh")
    loss, correct, probs = readout_ce(hs, W, c, labels)
    return loss, correct, hs, probs


def readout_ce(hs: torch.Tensor, W: torch.Tensor, c: torch.Tensor, labels: torch.Tensor):
    """Linear readout and cross-entropy of states ``hs [N, T, B, S]`` (time-major) against
    ``labels [N, T, B]`` (−100 and other negatives: ignored).

    Logits in class-major layout ``[N, C, T·B]`` (one GEMM), so the softmax over a few
    classes is a few contiguous passes.  Returns (summed loss ``[N]``, argmax hits ``[N]``,
    probabilities ``[N, C, T·B]`` for :func:`readout_ce_grad`).
    """
    n, t_len, bsz, s = hs.shape
    rows = t_len * bsz
    z = torch.baddbmm(c[:, :, None], W, hs.view(n, rows, s).mT)  # logits [N, C, T·B]
    lab = labels.reshape(n, 1, rows)
    valid = lab[:, 0] >= 0  # [N, T·B]
    zmax = z.amax(1, keepdim=True)  # [N, 1, T·B]
    z_y = z.gather(1, lab.clamp(min=0))  # [N, 1, T·B]
    correct = _argmax_hits(z, z_y, zmax, lab, valid).sum(1)
    probs = z.sub_(zmax).exp_()  # in place: z is not needed after this
    total = probs.sum(1, keepdim=True)
    probs.div_(total)
    nll = (total.log_() + zmax - z_y)[:, 0]  # [N, T·B]
    return torch.where(valid, nll, 0.0).sum(1), correct, probs


def readout_ce_grad(probs: torch.Tensor, labels: torch.Tensor, grad_loss: torch.Tensor, hs: torch.Tensor):
    """Backward of :func:`readout_ce` up to the states: turns ``probs`` (in place) into
    ∂L/∂z = (softmax − onehot)·valid·grad_loss and returns (∂L/∂z row-major ``[N, T, B, C]``,
    ∂L/∂W ``[N, C, S]``, ∂L/∂c ``[N, C]``).  Call it before ``hs`` is overwritten."""
    n, t_len, bsz, s = hs.shape
    lab = labels.reshape(n, 1, t_len * bsz)
    g = probs
    g.scatter_add_(1, lab.clamp(min=0), torch.full_like(g[:, :1], -1.0))
    g.mul_(torch.where(lab >= 0, grad_loss.view(n, 1, 1).to(g.dtype), 0.0))
    gW = torch.bmm(g, hs.view(n, t_len * bsz, s))  # [N, C, S]
    g_rows = g.mT.contiguous().view(n, t_len, bsz, -1)  # row-major: the per-step readout term is a K = C GEMM
    return g_rows, gW, g.sum(2)


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


def fused_call(name, apply, phi, tokens, labels, tables, mats, W, c) -> tuple[torch.Tensor, torch.Tensor]:
    """The front and back shared by the fused tracker losses.

    Checks ``phi`` and the shapes (:func:`check_shapes`), adds the model dimension for a
    single model (``A`` given as ``[S, S]``), answers zero loss and zero hits when there
    are no positions, brings every parameter to one dtype and the tokens and labels to
    time-major ``[N, T, B]``, calls ``apply(tokens, labels, *tables, *mats, W, c)`` (an
    entry of ``mats`` may be None: an absent matrix) and removes the model dimension again.
    """
    single, tokens, labels, tables, mats, W, c = _with_model_dim(name, phi, tokens, labels, tables, mats, W, c)
    check_shapes(tokens, labels, tables, [m for m in mats if m is not None], W, c)
    params = [*tables, *(m for m in mats if m is not None), W, c]
    n = tokens.shape[0]
    if tokens.shape[1] == 0 or tokens.shape[2] == 0:  # no positions: zero loss, zero hits
        zero = sum(p.sum() * 0.0 for p in params)
        loss, correct = zero.expand(n).clone(), torch.zeros(n, dtype=torch.long, device=tokens.device)
    else:
        dtype = params[0].dtype
        for p in params[1:]:
            dtype = torch.promote_types(dtype, p.dtype)
        tables = [t.to(dtype).contiguous() for t in tables]
        mats = [m.to(dtype).contiguous() if m is not None else None for m in mats]
        tok_tm = tokens.transpose(1, 2).contiguous()  # [N, T, B]
        lab_tm = labels.transpose(1, 2).contiguous()
        loss, correct = apply(tok_tm, lab_tm, *tables, *mats, W.to(dtype).contiguous(), c.to(dtype).contiguous())
    return (loss[0], correct[0]) if single else (loss, correct)


def _with_model_dim(name, phi, tokens, labels, tables, mats, W, c):
    """Check ``phi``; for a single model (``mats[0]`` is ``[S, S]``) add the leading model
    dimension to every argument.  Returns ``(single, tokens, labels, tables, mats, W, c)``."""
    if phi not in PHIS:
        raise ValueError(f"unknown phi {phi!r} for the {name} loss; allowed: {', '.join(PHIS)}")
    single = mats[0].dim() == 2
    if single:
        tokens, labels, W, c = (x[None] for x in (tokens, labels, W, c))
        tables = [t[None] for t in tables]
        mats = [m[None] if m is not None else None for m in mats]
    return single, tokens, labels, tables, mats, W, c


def check_shapes(tokens, labels, tables, mats, W, c) -> None:
    """Raise ``ValueError`` (one line, the shapes) unless the arguments of a fused tracker
    loss fit together: tokens/labels ``[N, B, T]``, tables ``[N, V, S]``, state matrices
    ``mats`` ``[N, S, S]``, W ``[N, C, S]``, c ``[N, C]``, and every token id in ``[0, V)``."""
    parts = [tokens, labels, *tables, *mats, W, c]
    shapes = ", ".join(str(tuple(x.shape)) for x in parts)
    ok = tokens.dim() == 3 and labels.shape == tokens.shape and W.dim() == 3 and c.dim() == 2
    ok = ok and all(t.dim() == 3 and t.shape == tables[0].shape for t in tables) and all(m.dim() == 3 for m in mats)
    if ok:
        n, s = tokens.shape[0], mats[0].shape[-1]
        ok = all(x.shape[0] == n for x in parts[2:]) and all(m.shape[1:] == (s, s) for m in mats)
        ok = ok and tables[0].shape[2] == s and W.shape[2] == s and c.shape[1] == W.shape[1]
    if not ok:
        raise ValueError(
            "expected tokens/labels [N, B, T], tables [N, V, S], state matrices [N, S, S], W [N, C, S], c [N, C] "
            f"with one N, S and C; got {shapes}"
        )
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= tables[0].shape[1]):
        raise ValueError(
            f"token ids must lie in [0, {tables[0].shape[1]}); got {int(tokens.min())}..{int(tokens.max())}"
        )


def dense_tracker_loss_reference(
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

    return reference_call("dense tracker", pre, phi, tokens, labels, [E], [A], W, c)


def reference_call(name, pre, phi, tokens, labels, tables, mats, W, c) -> tuple[torch.Tensor, torch.Tensor]:
    """The loop shared by the references: for each model m, h_t = phi(pre(h_{t−1}, x_t,
    tables[m], mats[m])) from h_{−1} = 0, then the readout's summed cross-entropy and hits
    (``mats`` entries may be None, as in :func:`fused_call`)."""
    single, tokens, labels, tables, mats, W, c = _with_model_dim(name, phi, tokens, labels, tables, mats, W, c)
    losses, hits = [], []
    for m in range(tokens.shape[0]):
        tabs_m = [t[m] for t in tables]
        mats_m = [x[m] if x is not None else None for x in mats]
        h = tables[0].new_zeros(tokens.shape[1], mats[0].shape[-1])  # [B, S]
        states = []
        for t in range(tokens.shape[2]):
            h = pre(h, tokens[m, :, t], tabs_m, mats_m)
            h = torch.tanh(h) if phi == "tanh" else h
            states.append(h)
        loss_m, hits_m = _ce_reference(torch.stack(states, 1), W[m], c[m], labels[m])  # states [B, T, S]
        losses.append(loss_m)
        hits.append(hits_m)
    loss, correct = torch.stack(losses), torch.stack(hits)
    return (loss[0], correct[0]) if single else (loss, correct)


def _ce_reference(states: torch.Tensor, W: torch.Tensor, c: torch.Tensor, labels: torch.Tensor):
    """Summed cross-entropy and argmax hits of the readout ``states [B, T, S] → [B, T, C]``."""
    z = states @ W.T + c
    valid = labels >= 0
    nll = torch.nn.functional.cross_entropy(z.flatten(0, 1), labels.clamp(min=0).flatten(), reduction="none")
    return torch.where(valid.flatten(), nll, 0.0).sum(), ((z.argmax(-1) == labels) & valid).sum()
