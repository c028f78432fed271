"""Mamba-2's mixer between its two projections as one op, per member of a stack: the short
convolution and its SiLU, the step sizes, the single-chunk SSD and the gated RMSNorm, with
one hand-written backward that writes the gradient of ``in_proj``'s output in place.

``mamba2_inner(zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, eps, heads, head_dim,
d_state)`` takes ``in_proj``'s output ``zxbcdt [E, B, T, W]`` (``W = 2·H·P + 2N + H``, split as
``z [H·P] | x [H·P] | B [N] | C [N] | dt [H]``) and returns what ``out_proj`` reads, per
member ``e``::

    x, B, C = split(silu(causal_conv(xBC; conv_w[e], conv_b[e])))
    dt      = softplus(dt_raw + dt_bias[e]),      A = −exp(A_log[e])
    y       = SSD(x, dt, A, B, C)                 (zero initial state, T ≤ one chunk)
    out     = RMSNorm((y + D[e]·x) · silu(z); norm_w[e], eps)

— :meth:`dynlab.lm.mixers.Mamba2Mixer.forward` without its projections, the function
:func:`mamba2_inner_ref` computes through autograd from the ops' references.

Why one op: the stack's layer as separate ops (:func:`kernels.short_conv.causal_conv_silu`,
:func:`kernels.ssd.single_chunk.ssd_single_chunk`, :func:`kernels.gated_norm.gated_rms_norm`)
already runs each in one C pass each way, but autograd glues them with the splits of
``zxbcdt`` and of the convolution's output, and a split's backward is a ``cat`` that copies
every gradient once more into a new ``[E, B, T, W]`` tensor (the largest activation of a
small LM's step).  Here the backward runs the same three C loops in order and each writes
its gradient straight into its slice of one ``[E, B, T, W]`` buffer (the gated norm's ``z``
and skip gradients, the scan's ``x``, ``B`` and ``C`` gradients, which adds to the skip's, the
convolution's input gradient), so nothing is concatenated and no step-size glue is left to
autograd.  It computes the same function with the same loops and the same order of every
sum as the separate ops (tests/kernels/test_mixer_inner.py compares it with them and with the
autograd reference, values and gradients).

:func:`mamba2_inner_applies` says when the C loops run it (CPU, float32/float64, one dtype,
``1 ≤ T``, the three libraries built); the stack calls it only for a zero initial state and
conv window, a window that fits one chunk, and no final state read (training with the zero
intervention), and keeps the separate ops everywhere else.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from ..compiled import data_pointer
from ..gated_norm import norm as _norm
from ..short_conv import conv as _conv
from . import single_chunk as _ssd

__all__ = ["mamba2_inner", "mamba2_inner_applies", "mamba2_inner_ref"]

_SUFFIX = {torch.float32: "f32", torch.float64: "f64"}


def _check(zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, heads, head_dim, d_state) -> tuple[int, int, int]:
    """``(H·P, conv channels, W)``, or a ValueError naming the shapes that do not fit."""
    di, cc = heads * head_dim, heads * head_dim + 2 * d_state
    w = di + cc + heads
    e = zxbcdt.shape[0] if zxbcdt.dim() == 4 else -1
    if (zxbcdt.dim() != 4 or zxbcdt.shape[-1] != w or conv_w.dim() != 3 or conv_w.shape[0] != e
            or conv_w.shape[2] != cc or (conv_b is not None and tuple(conv_b.shape) != (e, cc))
            or any(tuple(v.shape) != (e, heads) for v in (dt_bias, A_log, D)) or tuple(norm_w.shape) != (e, di)):
        raise ValueError(f"mamba2_inner: need zxbcdt [E, B, T, {w}], conv_w [E, K, {cc}], conv_b [E, {cc}] or None, "
                         f"dt_bias, A_log and D [E, {heads}], norm_w [E, {di}]; got {tuple(zxbcdt.shape)}, "
                         f"{tuple(conv_w.shape)}, {None if conv_b is None else tuple(conv_b.shape)}, "
                         f"{tuple(dt_bias.shape)}, {tuple(A_log.shape)}, {tuple(D.shape)}, {tuple(norm_w.shape)}")
    return di, cc, w


def mamba2_inner_ref(zxbcdt: torch.Tensor, conv_w: torch.Tensor, conv_b: torch.Tensor | None,
                     dt_bias: torch.Tensor, A_log: torch.Tensor, D: torch.Tensor, norm_w: torch.Tensor,
                     eps: float | None, heads: int, head_dim: int, d_state: int) -> torch.Tensor:
    """The reference, through autograd from the ops' references: zxbcdt ``[E, B, T, W]``,
    conv_w ``[E, K, C]`` (tap ``K − 1`` multiplies the current input), conv_b ``[E, C]`` or
    None, dt_bias, A_log, D ``[E, H]``, norm_w ``[E, H·P]`` -> ``[E, B, T, H·P]`` (module docstring)."""
    di, cc, _ = _check(zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, heads, head_dim, d_state)
    e, b, t, _ = zxbcdt.shape
    z, xbc, dt_raw = torch.split(zxbcdt, [di, cc, heads], dim=-1)
    post = _conv.causal_conv_silu_ref(xbc, conv_w, conv_b, None)
    xs, B, C = torch.split(post, [di, d_state, d_state], dim=-1)
    dt = F.softplus(dt_raw + dt_bias[:, None, None, :])
    A = -torch.exp(A_log)
    y, _ = _ssd.ssd_single_chunk_ref(xs.reshape(e * b, t, heads, head_dim), dt.reshape(e * b, t, heads),
                                     A[:, None, :].expand(e, b, heads).reshape(e * b, heads),
                                     B.reshape(e * b, t, d_state), C.reshape(e * b, t, d_state))
    return _norm.gated_rms_norm_ref(y.reshape(e, b, t, di), z, norm_w, eps, xs,
                                    D.repeat_interleave(head_dim, dim=1))


def mamba2_inner_applies(zxbcdt: torch.Tensor, *others: torch.Tensor | None) -> bool:
    """Whether :func:`mamba2_inner` runs the C loops for these tensors: CPU, float32 or
    float64, one dtype, at least one step, and the three libraries available."""
    return (zxbcdt.device.type == "cpu" and zxbcdt.dtype in _SUFFIX and zxbcdt.dim() == 4 and zxbcdt.shape[2] > 0
            and all(o is None or (o.dtype == zxbcdt.dtype and o.device.type == "cpu") for o in others)
            and _conv.c_library() is not None and _ssd.c_library() is not None and _norm.c_library() is not None)


def mamba2_inner(zxbcdt: torch.Tensor, conv_w: torch.Tensor, conv_b: torch.Tensor | None,
                 dt_bias: torch.Tensor, A_log: torch.Tensor, D: torch.Tensor, norm_w: torch.Tensor,
                 eps: float | None, heads: int, head_dim: int, d_state: int) -> torch.Tensor:
    """:func:`mamba2_inner_ref`'s function, the C loops with one backward where
    :func:`mamba2_inner_applies` (module docstring), else the reference itself.  eps None:
    the dtype's machine epsilon (``nn.RMSNorm``'s)."""
    _check(zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, heads, head_dim, d_state)
    if not mamba2_inner_applies(zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w):
        return mamba2_inner_ref(zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, eps, heads, head_dim, d_state)
    e = torch.finfo(zxbcdt.dtype).eps if eps is None else float(eps)
    return _inner_c(zxbcdt, conv_w.contiguous(), None if conv_b is None else conv_b.contiguous(), dt_bias, A_log,
                    D.repeat_interleave(head_dim, dim=1), norm_w.contiguous(), e, (heads, head_dim, d_state))


@torch.compiler.disable  # torch.compile runs the C loops as they are (it cannot trace a ctypes call)
def _inner_c(zxbcdt, conv_w, conv_b, dt_bias, A_log, D_rep, norm_w, eps, sizes):
    return _Mamba2InnerC.apply(zxbcdt, conv_w, conv_b, dt_bias, A_log, D_rep, norm_w, eps, sizes)


class _Mamba2InnerC(torch.autograd.Function):
    """Forward: the convolution, the SSD and the gated norm's C loops, each reading its inputs
    in place from ``zxbcdt`` and the convolution's output; backward: the same loops' backward
    passes in reverse, each writing into its slice of one gradient of ``zxbcdt``."""

    @staticmethod
    def forward(ctx, zxbcdt, conv_w, conv_b, dt_bias, A_log, D_rep, norm_w, eps, sizes):
        h, p, n = sizes
        di, cc = h * p, h * p + 2 * n
        e, b, t, w = zxbcdt.shape
        k = conv_w.shape[1]
        suf = _SUFFIX[zxbcdt.dtype]
        zx = zxbcdt.contiguous()
        post = torch.empty(e, b, t, cc, dtype=zx.dtype)  # silu(conv(xBC)): x | B | C
        getattr(_conv.c_library(), f"dl_sc_fwd_{suf}")(e, b, t, cc, k, w, *map(data_pointer, (zx[..., di:], None, conv_w,
                                                                                       conv_b, post)))
        dt_in = zx[..., di + cc:] + dt_bias[:, None, None, :]  # [E, B, T, H]
        dt = F.softplus(dt_in)
        A = -torch.exp(A_log)
        a_rows = A[:, None, :].expand(e, b, h).reshape(e * b, h)
        y = torch.empty(e * b, t, h, p, dtype=zx.dtype)
        if getattr(_ssd.c_library(), f"dl_ssd1_fwd_{suf}")(e * b, t, h, p, n, cc, cc, cc, *map(data_pointer, (
                post, dt, a_rows, post[..., di:], post[..., di + n:], y, None))):
            raise MemoryError(f"single-chunk SSD: out of memory for [{t}, {t}] buffers")
        out = torch.empty(e, b, t, di, dtype=zx.dtype)
        if getattr(_norm.c_library(), f"dl_gn_fwd_{suf}")(e, b * t, di, di, w, cc, eps, *map(data_pointer, (
                y, zx, post, D_rep, norm_w, out))):
            raise MemoryError(f"gated norm: out of memory for a [{di}] buffer")
        ctx.save_for_backward(zx, conv_w, conv_b, post, dt_in, dt, a_rows, A, y, D_rep, norm_w)
        ctx.eps, ctx.sizes = eps, sizes
        return out

    @staticmethod
    def backward(ctx, grad_out):
        zx, conv_w, conv_b, post, dt_in, dt, a_rows, A, y, D_rep, norm_w = ctx.saved_tensors
        h, p, n = ctx.sizes
        di, cc = h * p, h * p + 2 * n
        e, b, t, w = zx.shape
        k = conv_w.shape[1]
        suf = _SUFFIX[zx.dtype]
        go = grad_out.contiguous()
        g_zx = torch.empty(e, b, t, w, dtype=zx.dtype)  # the gradient of in_proj's output, slice by slice
        g_post = torch.empty(e, b, t, cc, dtype=zx.dtype)
        g_y = torch.empty(e * b, t, h, p, dtype=zx.dtype)
        g_norm_w, g_d_rep = torch.zeros_like(norm_w), torch.zeros_like(D_rep)
        # gated norm: z's gradient into g_zx, the skip's (D·x) into g_post's x slice
        if getattr(_norm.c_library(), f"dl_gn_bwd_{suf}")(e, b * t, di, di, w, cc, w, cc, ctx.eps, *map(data_pointer, (
                y, zx, post, D_rep, norm_w, go, g_y, g_zx, g_post, g_d_rep, g_norm_w))):
            raise MemoryError(f"gated norm backward: out of memory for a [{3 * di}] buffer")
        # SSD: x's gradient added to the skip's, B's and C's into their slices of g_post
        g_dt, g_a = torch.empty_like(dt), torch.empty_like(a_rows)
        if getattr(_ssd.c_library(), f"dl_ssd1_bwd_{suf}")(e * b, t, h, p, n, cc, cc, cc, cc, cc, cc, 1, *map(data_pointer, (
                post, dt, a_rows, post[..., di:], post[..., di + n:], y, g_y, None, g_post, g_dt, g_a,
                g_post[..., di:], g_post[..., di + n:]))):
            raise MemoryError(f"single-chunk SSD backward: out of memory for [{t}, {t}] buffers")
        g_dt_in = torch.ops.aten.softplus_backward(g_dt, dt_in, 1.0, 20.0)  # F.softplus's backward
        g_zx[..., di + cc:] = g_dt_in
        # the convolution: xBC's gradient into g_zx
        g_cw = torch.zeros_like(conv_w)
        g_cb = None if conv_b is None else torch.zeros_like(conv_b)
        if getattr(_conv.c_library(), f"dl_sc_bwd_{suf}")(e, b, t, cc, k, w, w, *map(data_pointer, (
                zx[..., di:], None, conv_w, conv_b, g_post, g_zx[..., di:], None, g_cw, g_cb))):
            raise MemoryError(f"short conv backward: out of memory for a [{t}, {cc}] buffer")
        g_a_log = g_a.view(e, b, h).sum(dim=1) * A  # d(−exp(A_log)) = A dA_log
        return (g_zx, g_cw, g_cb, g_dt_in.sum(dim=(1, 2)), g_a_log, g_d_rep, g_norm_w, None, None)
