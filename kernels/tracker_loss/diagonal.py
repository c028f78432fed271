"""Fused training loss of a one-layer diagonal (Mamba-family) tracker: tokens → cross-entropy, one op.

The model (one layer, linear readout, zero initial state), with H channels and per-token
tables gathered at the token x_t, in one of two forms.  Real states (mamba,
negative-mamba), K states per channel (S = H·K)::

    h_t[d, k] = a[x_t, d, k]·h_{t−1}[d, k] + b[x_t, d, k],     h_{−1} = 0
    y_t[d]    = g[x_t, d]·Σ_k C[x_t, k]·h_t[d, k] + e[x_t, d]

Complex states (mamba3, aussm), one per channel::

    h_t[d] = a[x_t, d]·h_{t−1}[d] + b[x_t, d]                  (complex a, b)
    y_t[d] = g[x_t, d]·Re(C[x_t, d]·h_t[d]) + e[x_t, d]         (complex C)

and in both::

    z_t  = W y_t + c                                            (logits, Cls classes)
    loss = Σ_{b,t valid} ( logsumexp(z_{b,t}) − z_{b,t}[y_{b,t}] )

The tables are the cell's own precomputed terms over the vocabulary, formed by the caller
under autograd (:meth:`dynlab.tracking.models.MambaCell.diagonal_tables` and its twins, called by
:func:`dynlab.tracking.train.engine.fused_loss`), so their gradients flow on to the cell's
parameters.  For mamba: a = exp(Δ·A) (negative-mamba: 2·exp(Δ·A) − 1), b = Δ·x·B,
C = W_C x̃, g = silu(z), e = D·x·silu(z), so y_t is the cell's readout
(C_t·h_t + D·x_t)·silu(z_t).

Why a fused op: the recurrence is elementwise, so a training step is bound by memory
traffic, not arithmetic.  Under autograd the scan, the readout and their backward passes
stream ``[B, T, S]`` tensors many times (the gathered a_t and b_t, the states, the
readout's product, ∂L/∂h_t, ∂L/∂a_t, ∂L/∂b_t).  Here:

- forward: per step, the rows a[x_t], b[x_t] are gathered into cache-sized ``[B, S]``
  scratch, h_t is formed in place in the one full-size buffer (time-major ``[T, N, B, S]``)
  and its readout Σ_k C_k h_t[:, k] is taken while h_t is in cache; the logits and
  cross-entropy are the shared class-major pass (:func:`.common.readout_ce`);
- backward: ∂L/∂y from the logits, then one reverse-time loop whose adjoint
  λ_t = ∂L/∂h_t = (∂L/∂y_t ⊙ g)⊗C[x_t] + a[x_{t+1}] ⊙ λ_{t+1} lives in ``[B, S]`` scratch:
  each step adds λ_t (∂L/∂b) and λ_t ⊙ h_{t−1} (∂L/∂a) straight into the ``[V, S]``
  table gradients (``index_add_``) and forms ∂L/∂C from h_t, so the only full-size
  traffic of the backward pass is one read of the states.

On the CPU both time loops run as C (``_C_SOURCE``, built by :mod:`.compiled`): the same
arithmetic, each row of each step in one pass, about twice as fast as the torch loops
(:func:`_forward_scan`, :func:`_backward_scan`), which run on other devices, without a C
compiler, and with ``DYNLAB_C_KERNELS=0``.

Many models (an ensemble: a leading dimension N on every argument) run in one call: on the
CPU one member at a time (:func:`.common.member_groups`), on as many Python threads as the caller
gives intra-op threads, each member on one core; the whole stack per step on other
devices.  On the CPU each member's numbers are therefore bit-identical to the member run
alone on one thread (tested).

:func:`diagonal_tracker_loss_ref` is the same model as a plain loop under autograd;
the tests compare the two (``tests/kernels/test_tracker_loss_diagonal.py``).

Long module: the forward scan and its hand-written reverse-time backward read and write the
same saved buffers (time-major states, gathered table rows) under the conventions above, and
the streaming entry points and the reference loss follow the same conventions and are tested
against each other; split, a change to the layout would have to be made in several files at once.
"""

from __future__ import annotations

import ctypes
from pathlib import Path
from typing import NamedTuple

import torch

from ..compiled import C_SUFFIXES, c_library, c_suffix, data_pointer
from ..first_order import first_order
from .common import BUFFERS, map_members, member_groups, readout_ce, readout_ce_grad, token_rows

__all__ = [
    "StreamOutput",
    "compiled_loops_apply",
    "diagonal_tracker_logits",
    "diagonal_tracker_loss",
    "diagonal_tracker_loss_ref",
    "diagonal_tracker_stream",
    "member_groups",
]

#: The CPU's per-step loops in C (:mod:`.compiled`): one pass over each row per step, the same
#: arithmetic as :func:`_forward_scan` / :func:`_backward_scan` (sums in another order);
#: the source is ``diagonal.c`` beside this module.
_C_SOURCE = (Path(__file__).parent / "diagonal.c").read_text(encoding="utf-8")



def _c_kernels() -> ctypes.CDLL | None:
    """The compiled loops (argument types set once), or None: the torch loops run."""
    lib = c_library("diagonal_tracker", _C_SOURCE)
    if lib is not None and not hasattr(lib, "_dynlab_ready"):
        i64, ptr = ctypes.c_int64, ctypes.c_void_p
        for suf in C_SUFFIXES.values():
            for name, ints, ptrs in (("dl_dt_fwd", 4, 8), ("dl_dt_bwd", 5, 13), ("dl_dtc_fwd", 3, 8),
                                     ("dl_dtc_bwd", 4, 13), ("dl_dt_stream", 5, 11), ("dl_dtc_stream", 4, 11)):
                fn = getattr(lib, f"{name}_{suf}")
                fn.argtypes, fn.restype = [i64] * ints + [ptr] * ptrs, ctypes.c_int
        lib._dynlab_ready = True
    return lib


def _use_c(x: torch.Tensor, n: int) -> ctypes.CDLL | None:
    """The compiled loops when they apply: one member on the CPU, float32 or float64."""
    real = x.real.dtype if x.is_complex() else x.dtype
    if x.device.type != "cpu" or n != 1 or c_suffix(real) is None:
        return None
    return _c_kernels()


def compiled_loops_apply(x: torch.Tensor) -> bool:
    """True when one model's tensors like ``x`` run the compiled C loops (CPU, float32 or
    float64, a C compiler, ``DYNLAB_C_KERNELS`` not ``0``)."""
    return _use_c(x, 1) is not None


def _p(*xs: torch.Tensor) -> list[int]:
    return [x.data_ptr() for x in xs]


class _DiagonalTrackerLoss(torch.autograd.Function):
    """Canonical shapes: tokens, labels [N, T, B] (time-major); a, b [N, V, H, K];
    C [N, V, K]; g, e [N, V, H]; W [N, Cls, H]; c [N, Cls].
    Outputs: loss sums [N], correct counts [N] (no gradient)."""

    @staticmethod
    def forward(ctx, tokens, labels, a, b, C, g, e, W, c):
        groups = member_groups(tokens.shape[0], a.device)
        out = map_members(lambda sl: _group_forward(*(x[sl] for x in (tokens, labels, a, b, C, g, e, W, c))), groups)
        loss = torch.cat([o[0] for o in out])
        correct = torch.cat([o[1] for o in out])
        ctx.groups = [o[2] for o in out]  # buffers and saved tensors, plain refs (see backward)
        # plain refs skip autograd's version check: record the inputs' versions ourselves
        ctx.versions = [(x, x._version) for x in (labels, a, b, C, g, e, W, c)]
        ctx.mark_non_differentiable(correct)
        return loss, correct

    @staticmethod
    @first_order("diagonal_tracker_loss")
    def backward(ctx, grad_loss, _grad_correct):
        with BUFFERS.lock:  # one backward per graph, even from two threads
            groups, ctx.groups = ctx.groups, None
        if groups is None:
            raise RuntimeError("diagonal_tracker_loss: backward through the same graph twice is not supported")
        if any(x._version != v for x, v in ctx.versions):
            raise RuntimeError("diagonal_tracker_loss: an input was modified in place between forward and backward")
        starts = [0]
        for saved in groups:
            starts.append(starts[-1] + saved["labels"].shape[0])
        jobs = [(saved, grad_loss[i:j]) for saved, i, j in zip(groups, starts, starts[1:])]
        grads = map_members(lambda job: _group_backward(*job), jobs)
        return (None, None, *(torch.cat(parts) for parts in zip(*grads)))


def _group_forward(tokens, labels, a, b, C, g, e, W, c):
    """Loss sums ``[n]``, hits ``[n]`` and what the backward pass needs, for a group of n members."""
    n, t_len, bsz = labels.shape
    v, h = g.shape[1:]
    rows = token_rows(tokens, v)  # [n·T·B], row i·V + x of the stacked tables
    steps = rows.view(n, t_len, bsz).transpose(0, 1).reshape(t_len, n * bsz)  # [T, n·B] per-step rows
    s = h if a.is_complex() else a.shape[2] * a.shape[3]
    hs = BUFFERS.take((t_len, n * bsz, s), a.dtype, a.device)  # h_t, time-major
    ch = BUFFERS.take((t_len, n * bsz, h), g.dtype, a.device)  # the readout of h_t before the gate
    y = BUFFERS.take((n, t_len, bsz, h), g.dtype, a.device)  # readout features
    g_rows = g.reshape(n * v, h)
    ge_rows = torch.cat([g_rows, e.reshape(n * v, h)], dim=1)  # [n·V, 2H]: one gather per step for both
    if a.is_complex():
        a_rows, b_rows, C_rows = a.reshape(n * v, h), b.reshape(n * v, h), C.reshape(n * v, h)
    else:
        k = a.shape[3]
        a_rows, b_rows = (x.transpose(-1, -2).reshape(n * v, k * h) for x in (a, b))  # state-major rows [K, H]
        C_rows = C.reshape(n * v, k)
    lib = _use_c(a, n)
    if lib is None:
        _forward_scan(hs, ch, y, steps, a_rows, b_rows, C_rows, ge_rows)
    else:
        suf, args = c_suffix(g.dtype), _p(steps, a_rows, b_rows, C_rows, ge_rows, hs, ch, y)
        if a.is_complex():
            err = getattr(lib, f"dl_dtc_fwd_{suf}")(t_len, bsz, h, *args)
        else:
            err = getattr(lib, f"dl_dt_fwd_{suf}")(t_len, bsz, a.shape[3], h, *args)
        if err:
            raise MemoryError("diagonal_tracker_loss: the compiled forward loop could not allocate its scratch")
    loss, correct, probs = readout_ce(y, W, c, labels)
    saved = dict(hs=hs, ch=ch, y=y, probs=probs, steps=steps, labels=labels,
                 a_rows=a_rows, C_rows=C_rows, g_rows=g_rows, W=W)
    return loss, correct, saved


def _group_backward(saved, grad_loss):
    """∂L/∂(a, b, C, g, e, W, c) of one group of members (:func:`_group_forward`)."""
    hs, ch, y, labels, W = saved["hs"], saved["ch"], saved["y"], saved["labels"], saved["W"]
    n, t_len, bsz = labels.shape
    h = y.shape[-1]
    v = saved["g_rows"].shape[0] // n
    dz, gW, gc = readout_ce_grad(saved["probs"], labels, grad_loss, y)  # ∂L/∂z [n, T, B, Cls]
    dz_steps = dz.transpose(0, 1).reshape(t_len, n, bsz, -1).contiguous()  # time-major (small: Cls columns)
    lib = _use_c(hs, n)
    if lib is None:
        ga, gb, gC, g_g, g_e = _backward_scan(
            hs, saved["steps"], dz_steps, W, saved["a_rows"], saved["C_rows"], saved["g_rows"], ch, n * v
        )
    else:
        ga, gb = torch.zeros_like(saved["a_rows"]), torch.zeros_like(saved["a_rows"])
        gC = torch.zeros_like(saved["C_rows"])
        g_g, g_e = torch.zeros_like(saved["g_rows"]), torch.zeros_like(saved["g_rows"])
        suf, ncls = c_suffix(y.dtype), dz.shape[-1]
        args = _p(saved["steps"], dz_steps, W, saved["a_rows"], saved["C_rows"], saved["g_rows"], hs, ch,
                  ga, gb, gC, g_g, g_e)
        if hs.is_complex():
            err = getattr(lib, f"dl_dtc_bwd_{suf}")(t_len, bsz, h, ncls, *args)
        else:
            err = getattr(lib, f"dl_dt_bwd_{suf}")(t_len, bsz, hs.shape[-1] // h, h, ncls, *args)
        if err:
            raise MemoryError("diagonal_tracker_loss: the compiled backward loop could not allocate its scratch")
    for buf in (hs, ch, y):  # nothing refers to them any more
        BUFFERS.give(buf)
    if hs.is_complex():
        ga, gb, gC = (x.view(n, v, h) for x in (ga, gb, gC))
    else:
        k = hs.shape[-1] // h
        ga, gb = (x.view(n, v, k, h).transpose(-1, -2) for x in (ga, gb))  # state-major back to [V, H, K]
        gC = gC.view(n, v, k)
    return ga, gb, gC, g_g.view(n, v, h), g_e.view(n, v, h), gW, gc


def _forward_scan(hs, ch, y, steps, a_rows, b_rows, C_rows, ge_rows) -> None:
    """Fill ``hs [T, M, S]`` (M = N·B rows) with h_t = a[x_t] ⊙ h_{t−1} + b[x_t] from
    h_{−1} = 0, ``ch [T, M, H]`` with the readout of h_t before the gate (real states:
    Σ_k C[x_t, k]·h_t[k, :]; complex states: Re(C[x_t] ⊙ h_t)) and ``y [N, T, B, H]`` with
    g[x_t] ⊙ ch_t + e[x_t], each step while h_t is in cache.

    Real states are stored state-major (each row ``[K, H]``, not the cell's ``[H, K]``), so
    every per-step product is vectorised along H: the readout contraction is a batched
    ``[1, K] @ [K, H]`` product rather than ``[H, K] @ [K, 1]``, and so is the adjoint's
    outer product, each several times faster this way (``docs/performance.md``)."""
    t_len, m, s = hs.shape
    n, h = y.shape[0], y.shape[-1]
    cplx = hs.is_complex()
    k = 1 if cplx else s // h
    a_t = hs.new_empty(m, s)
    c_t = hs.new_empty(m, h) if cplx else hs.new_empty(m, k)
    ge_t = ch.new_empty(m, 2 * h)
    g_t, e_t = ge_t[:, :h], ge_t[:, h:]
    prev = None
    ys = y.unbind(1)  # [N, B, H] views, one per step
    for t, (r, h_t, ch_t) in enumerate(zip(steps.unbind(0), hs.unbind(0), ch.unbind(0))):
        torch.index_select(b_rows, 0, r, out=h_t)
        if prev is not None:
            torch.index_select(a_rows, 0, r, out=a_t)
            h_t.addcmul_(a_t, prev)
        torch.index_select(C_rows, 0, r, out=c_t)
        if cplx:
            ch_t.copy_(torch.mul(c_t, h_t, out=a_t).real)  # a_t is free again: scratch
        else:
            torch.bmm(c_t.view(m, 1, k), h_t.view(m, k, h), out=ch_t.view(m, 1, h))
        torch.index_select(ge_rows, 0, r, out=ge_t)
        torch.addcmul(e_t.unflatten(0, (n, -1)), g_t.unflatten(0, (n, -1)), ch_t.view(n, -1, h), out=ys[t])
        prev = h_t


def _backward_scan(hs, steps, g_steps, W, a_rows, C_rows, g_rows, ch, n_rows):
    """The readout's backward and the reverse-time adjoint, one step at a time.

    Per step t (last first), all in ``[M, …]`` scratch (M = N·B rows): ∂L/∂y_t = ∂L/∂z_t W
    (``g_steps [T, N, B, Cls]``), dch_t = ∂L/∂y_t ⊙ g[x_t], and the adjoint
    λ_t = ∂L/∂h_t = (readout term) + conj(a[x_{t+1}]) ⊙ λ_{t+1} (carried as its conjugate
    for complex states), whose readout term is
    C[x_t] ⊗ dch_t for real states and dch_t ⊙ conj(C[x_t]) for complex ones (gradients of
    complex tensors as torch defines them, ∂L/∂Re + i·∂L/∂Im).  Accumulated into the table
    gradients at the rows of x_t (``index_add_``): ∂L/∂g += ∂L/∂y_t ⊙ ch_t,
    ∂L/∂e += ∂L/∂y_t, ∂L/∂b += λ_t, ∂L/∂a += λ_t ⊙ conj(h_{t−1}), and ∂L/∂C +=
    Σ_d dch_t[:, d]·h_t[:, :, d] (real) or dch_t ⊙ conj(h_t) (complex).

    Returns ``(∂a, ∂b, ∂C, ∂g, ∂e)`` as ``[n_rows, …]`` tables (real ∂a, ∂b state-major).
    """
    t_len, m, s = hs.shape
    n, h = W.shape[0], W.shape[2]
    bsz = m // n
    cplx = hs.is_complex()
    k = 1 if cplx else s // h
    # Complex states carry μ_t = conj(λ_t), whose recursion μ_t = C[x_t]·dch_t + a[x_{t+1}] ⊙ μ_{t+1}
    # and accumulations (μ, μ ⊙ h_{t−1}, dch ⊙ h_t) need no per-step conjugation (measured 2×
    # slower per op); the small tables are conjugated once at the end.  Complex table
    # gradients are accumulated through real views (a complex index_add_ was 5× slower).
    ga, gb = hs.new_zeros(n_rows, s), hs.new_zeros(n_rows, s)
    gC = hs.new_zeros(n_rows, h) if cplx else hs.new_zeros(n_rows, k)
    g_g, g_e = ch.new_zeros(n_rows, h), ch.new_zeros(n_rows, h)
    lam, lam_next = hs.new_empty(m, s), hs.new_empty(m, s)
    a_next, prod = hs.new_empty(m, s), hs.new_empty(m, s)
    c_t = hs.new_empty(m, h) if cplx else hs.new_empty(m, k)
    dC_t = hs.new_empty(m, h) if cplx else hs.new_empty(m, k)
    dy, dch, gate, tmp = (ch.new_empty(m, h) for _ in range(4))
    flat = torch.view_as_real if cplx else (lambda x: x)  # real views for index_add_
    acc_a, acc_b, acc_C = (flat(x).reshape(x.shape[0], -1) for x in (ga, gb, gC))
    src_lam = [flat(x).reshape(m, -1) for x in (lam, lam_next)]
    src_prod, src_dC = flat(prod).reshape(m, -1), flat(dC_t).reshape(m, -1)
    rs, hss, chs, dzs = steps.unbind(0), hs.unbind(0), ch.unbind(0), g_steps.unbind(0)
    for t in range(t_len - 1, -1, -1):
        r, h_t = rs[t], hss[t]
        if n == 1:  # the CPU's groups: a 2-D product, cheaper than a batch of one
            torch.mm(dzs[t][0], W[0], out=dy)  # ∂L/∂y_t
        else:
            torch.bmm(dzs[t], W, out=dy.view(n, bsz, h))
        g_e.index_add_(0, r, dy)
        g_g.index_add_(0, r, torch.mul(dy, chs[t], out=tmp))
        torch.index_select(g_rows, 0, r, out=gate)
        torch.mul(dy, gate, out=dch)
        torch.index_select(C_rows, 0, r, out=c_t)
        if cplx:
            torch.mul(c_t, dch, out=lam)  # readout term of μ_t = conj(∂L/∂h_t)
        else:
            torch.mul(dch.view(m, 1, h), c_t.view(m, k, 1), out=lam.view(m, k, h))  # of ∂L/∂h_t
        if t < t_len - 1:
            torch.index_select(a_rows, 0, rs[t + 1], out=a_next)
            lam.addcmul_(a_next, lam_next)
        if cplx:
            torch.mul(h_t, dch, out=dC_t)
        else:
            torch.bmm(dch.view(m, 1, h), h_t.view(m, k, h).mT, out=dC_t.view(m, 1, k))
        acc_C.index_add_(0, r, src_dC)
        acc_b.index_add_(0, r, src_lam[0])
        if t > 0:
            torch.mul(lam, hss[t - 1], out=prod)
            acc_a.index_add_(0, r, src_prod)
        lam, lam_next = lam_next, lam
        src_lam.reverse()
    if cplx:  # the accumulations hold conj(∂L/∂·)
        ga, gb, gC = ga.conj_physical_(), gb.conj_physical_(), gC.conj_physical_()
    return ga, gb, gC, g_g, g_e


def _check(tokens, labels, a, b, C, g, e, W, c) -> None:
    """Raise ``ValueError`` (one line, the shapes) unless the stacked arguments fit together."""
    parts = [tokens, labels, a, b, C, g, e, W, c]
    ok = tokens.dim() == 3 and labels.shape == tokens.shape and b.shape == a.shape and g.dim() == 3
    ok = ok and a.is_complex() == b.is_complex() == C.is_complex() and not (g.is_complex() or e.is_complex())
    if ok:
        n, v, h = g.shape
        if a.is_complex():
            ok = a.shape == (n, v, h) and C.shape == (n, v, h)
        else:
            ok = a.dim() == 4 and a.shape[:3] == (n, v, h) and C.shape == (n, v, a.shape[3])
        ok = (ok and e.shape == g.shape and W.dim() == 3 and W.shape[0] == n and W.shape[2] == h
              and c.shape == W.shape[:2] and tokens.shape[0] == n)
    if not ok:
        shapes = ", ".join(str(tuple(x.shape)) for x in parts)
        raise ValueError(
            "expected tokens/labels [N, B, T], a/b [N, V, H, K] real with C [N, V, K] or a/b/C [N, V, H] "
            f"complex, g/e [N, V, H] real, W [N, Cls, H], c [N, Cls] with one N, V, H; got {shapes}"
        )
    if tokens.numel() and (int(tokens.min()) < 0 or int(tokens.max()) >= g.shape[1]):
        raise ValueError(f"token ids must lie in [0, {g.shape[1]}); got {int(tokens.min())}..{int(tokens.max())}")


def _one_dtype(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """``params`` as contiguous tensors of one real dtype (the promotion of all of them) and
    its complex twin for the complex ones."""
    real = params[0].real.dtype if params[0].is_complex() else params[0].dtype
    for p in params:
        real = torch.promote_types(real, p.real.dtype if p.is_complex() else p.dtype)
    cplx = (torch.ones((), dtype=real) * 1j).dtype
    return [p.to(cplx if p.is_complex() else real).contiguous() for p in params]


def _with_model_dim(*args: torch.Tensor) -> tuple[bool, tuple[torch.Tensor, ...]]:
    """``(single, args)``: one model's arguments (``g`` is ``[V, H]``) get the leading model
    dimension N = 1; a stack's are returned as they are."""
    single = args[5].dim() == 2  # g
    return single, tuple(x[None] for x in args) if single else args


def diagonal_tracker_loss(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    C: torch.Tensor,
    g: torch.Tensor,
    e: torch.Tensor,
    W: torch.Tensor,
    c: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy and correct-count of a one-layer Mamba-style tracker (module docstring).

    Args:
        tokens: ``[B, T]`` token ids in ``[0, V)`` (or ``[N, B, T]``, one batch per model).
        labels: like ``tokens``; class ids, or −100 for positions to ignore.
        a: per-token decay: real ``[V, H, K]`` of any sign, or complex ``[V, H]`` (a
            rotation and decay per channel); ``[N, …]`` stacked.
        b: per-token drive, like ``a``.
        C: per-token readout: real ``[V, K]`` (the same for every channel) with real
            ``a``, complex ``[V, H]`` with complex ``a``; ``[N, …]`` stacked.
        g: per-token output gate ``[V, H]`` (or ``[N, V, H]``).
        e: per-token output offset, like ``g``.
        W: readout weight ``[Cls, H]`` (or ``[N, Cls, H]``).
        c: readout bias ``[Cls]`` (or ``[N, Cls]``).

    Returns:
        ``(loss, correct)``: the cross-entropy summed over valid positions (nats; a
        scalar, or ``[N]``), differentiable in every table, W and c (first derivatives
        only); and the number of valid positions whose label has the largest logit
        (int64, no gradient; the first maximum wins a tie, as ``torch.argmax``).
    """
    single, (tokens, labels, a, b, C, g, e, W, c) = _with_model_dim(tokens, labels, a, b, C, g, e, W, c)
    _check(tokens, labels, a, b, C, g, e, W, c)
    params = [a, b, C, g, e, W, c]
    if tokens.shape[1] == 0 or tokens.shape[2] == 0:  # no positions: zero loss, zero hits
        zero = sum(p.abs().sum() * 0.0 for p in params)
        loss = zero.expand(tokens.shape[0]).clone()
        correct = torch.zeros(tokens.shape[0], dtype=torch.long, device=tokens.device)
    else:
        params = _one_dtype(params)
        tok_tm, lab_tm = tokens.transpose(1, 2).contiguous(), labels.transpose(1, 2).contiguous()  # [N, T, B]
        loss, correct = _DiagonalTrackerLoss.apply(tok_tm, lab_tm, *params)
    return (loss[0], correct[0]) if single else (loss, correct)


class StreamOutput(NamedTuple):
    """What :func:`diagonal_tracker_stream` returns (None for an output not asked for)."""

    logits: torch.Tensor | None  # [B, T, Cls]
    states: torch.Tensor | None  # [B, T, H, K] real or [B, T, H] complex: h_t in the cell's layout
    features: torch.Tensor | None  # [B, T, H]: y_t, what the readout reads
    final: torch.Tensor  # [B, H, K] or [B, H]: h_{T−1}


@torch.no_grad()
def diagonal_tracker_stream(
    tokens: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    C: torch.Tensor,
    g: torch.Tensor,
    e: torch.Tensor,
    W: torch.Tensor,
    c: torch.Tensor,
    state: torch.Tensor | None = None,
    *,
    logits: bool = True,
    states: bool = False,
    features: bool = False,
) -> StreamOutput:
    """One Mamba-style tracker (the model of the module docstring) run from ``state``
    without gradients: what evaluation and the analyses stream, piece by piece.

    Args:
        tokens: ``[B, T]`` token ids in ``[0, V)``.
        a, b, C, g, e, W, c: one model's tables and readout, as
            :func:`diagonal_tracker_loss` (no stacked form).
        state: h_{−1}: real ``[B, H, K]`` (the cell's layout) or complex ``[B, H]``;
            None = zero.  Not written.
        logits, states, features: which per-step outputs to form (:class:`StreamOutput`).

    On the CPU (float32 or float64) one compiled loop runs each sequence to its end with
    its state row in cache (``dl_dt_stream`` in :data:`_C_SOURCE`); nothing of size
    ``[B, T, S]`` is formed unless ``states`` asks for it.  Elsewhere, or without a
    compiler, a torch loop over time with the same arithmetic.
    """
    _check(tokens[None, :, :], tokens[None, :, :], a[None], b[None], C[None], g[None], e[None], W[None], c[None])
    bsz, t_len = tokens.shape
    v, h = g.shape
    cplx = a.is_complex()
    # contiguous copies held by name: the C loop reads their memory through raw pointers
    a, b, C, g, e, W, c = _one_dtype([a, b, C, g, e, W, c])
    real = g.dtype
    shape = (bsz, h) if cplx else (bsz, *a.shape[1:])
    if state is None:
        state = torch.zeros(shape, dtype=a.dtype, device=a.device)
    elif tuple(state.shape) != shape or state.is_complex() != cplx:
        raise ValueError(f"state must be {'complex' if cplx else 'real'} {list(shape)}; got {list(state.shape)} {state.dtype}")
    state = state.to(a.dtype)
    lib = _use_c(a, 1)
    if lib is None or t_len == 0:
        return _stream_loop(tokens, a, b, C, g, e, W, c, state, logits, states, features)
    z = torch.empty(bsz, t_len, W.shape[0], dtype=real, device=a.device) if logits else None
    hs = torch.empty(bsz, t_len, *shape[1:], dtype=a.dtype, device=a.device) if states else None
    ys = torch.empty(bsz, t_len, h, dtype=real, device=a.device) if features else None
    tok = tokens.to(torch.int64).contiguous()
    ge = torch.cat([g, e], dim=1)  # [V, 2H]
    outs = [data_pointer(x) for x in (z, hs, ys)]
    suf = c_suffix(real)
    if cplx:
        st = state.clone().contiguous()  # [B, H] complex: (re, im) interleaved
        err = getattr(lib, f"dl_dtc_stream_{suf}")(t_len, bsz, h, W.shape[0], *_p(tok, a, b, C, ge, W, c, st), *outs)
        final = st
    else:
        k = a.shape[2]
        rows = [x.transpose(-1, -2).reshape(v, k * h).contiguous() for x in (a, b)]  # state-major rows [K, H]
        st = state.transpose(-1, -2).clone(memory_format=torch.contiguous_format)  # [B, K, H], never the caller's
        err = getattr(lib, f"dl_dt_stream_{suf}")(t_len, bsz, k, h, W.shape[0], *_p(tok, *rows, C, ge, W, c, st), *outs)
        final = st.transpose(-1, -2).contiguous()
    if err:
        raise MemoryError("diagonal_tracker_stream: the compiled loop could not allocate its scratch")
    return StreamOutput(z, hs, ys, final)


def diagonal_tracker_logits(tokens, a, b, C, g, e, W, c, state=None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(logits [B, T, Cls], final state)`` of :func:`diagonal_tracker_stream`."""
    out = diagonal_tracker_stream(tokens, a, b, C, g, e, W, c, state)
    return out.logits, out.final


def _stream_loop(tokens, a, b, C, g, e, W, c, state, logits, states, features) -> StreamOutput:
    """:func:`diagonal_tracker_stream` as a torch loop over time (other devices, no compiler)."""
    zs, hs, ys = [], [], []
    for t in range(tokens.shape[1]):
        x = tokens[:, t]
        state = a[x] * state + b[x]
        read = (C[x] * state).real if a.is_complex() else (state * C[x][:, None, :]).sum(-1)
        y = g[x] * read + e[x]
        zs.append(torch.addmm(c, y, W.T))
        hs.append(state)
        ys.append(y)

    def stacked(xs: list, want: bool, empty: tuple, dtype) -> torch.Tensor | None:
        if not want:
            return None
        return torch.stack(xs, 1) if xs else torch.empty(tokens.shape[0], 0, *empty, dtype=dtype, device=a.device)

    return StreamOutput(
        stacked(zs, logits, (W.shape[0],), W.dtype),
        stacked(hs, states, tuple(state.shape[1:]), state.dtype),
        stacked(ys, features, (g.shape[1],), g.dtype),
        state.clone(),
    )


def diagonal_tracker_loss_ref(
    tokens: torch.Tensor,
    labels: torch.Tensor,
    a: torch.Tensor,
    b: torch.Tensor,
    C: torch.Tensor,
    g: torch.Tensor,
    e: torch.Tensor,
    W: torch.Tensor,
    c: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """The model of :func:`diagonal_tracker_loss` as a plain loop under autograd (the
    definition the fused op is tested against).  Same arguments and returns."""
    single, (tokens, labels, a, b, C, g, e, W, c) = _with_model_dim(tokens, labels, a, b, C, g, e, W, c)
    losses, hits = [], []
    for m in range(tokens.shape[0]):
        x = tokens[m]  # [B, T]
        state = a.new_zeros(x.shape[0], *a.shape[2:])  # [B, H, K] real or [B, H] complex
        ys = []
        for t in range(x.shape[1]):
            state = a[m][x[:, t]] * state + b[m][x[:, t]]
            if a.is_complex():
                read = (C[m][x[:, t]] * state).real  # Re(C ⊙ h)
            else:
                read = (state * C[m][x[:, t]][:, None, :]).sum(-1)  # Σ_k C_k h[:, k]
            ys.append(g[m][x[:, t]] * read + e[m][x[:, t]])
        z = torch.stack(ys, 1) @ W[m].T + c[m]  # [B, T, Cls]
        lab = labels[m]
        valid = lab >= 0
        nll = torch.nn.functional.cross_entropy(z.flatten(0, 1), lab.clamp(min=0).flatten(), reduction="none")
        losses.append(torch.where(valid.flatten(), nll, 0.0).sum())
        hits.append(((z.argmax(-1) == lab) & valid).sum())
    loss, correct = torch.stack(losses), torch.stack(hits)
    return (loss[0], correct[0]) if single else (loss, correct)
