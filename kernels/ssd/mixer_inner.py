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

— :meth:`dynlab.lm.models.mixers.Mamba2Mixer.forward` without its projections, the function
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

The three C loops run block by block of a member's sequences (``mixer_inner.c``, which
calls the three libraries' functions through pointers): run one after the other over the
whole stack, each loop streamed the activations the previous one wrote through memory, and
the backward wrote the gradients of ``y`` and of the convolution's output to whole-stack
tensors only to read them back.  A block holds as many sequences as fit
:data:`CACHE_BLOCK_BYTES` of those activations (at least one), and the backward keeps the two
gradients in a block-sized scratch.  Each loop computes per sequence what it computed over
the stack, and the weight gradients accumulate sequence after sequence in the same order,
so the numbers do not depend on the block size (tested bit for bit).

:func:`mamba2_inner_applies` says when the C loops run it (CPU, float32/float64, one dtype,
``1 ≤ T``, the four libraries built); the stack calls it only for a zero initial state and
conv window, a window that fits one chunk, and no final state read (training with the zero
intervention), and keeps the separate ops everywhere else.
"""

from __future__ import annotations

import ctypes
from pathlib import Path

import torch
import torch.nn.functional as F

from ..compiled import c_suffix, data_pointer, typed_library
from ..first_order import first_order
from ..gated_norm import norm as _norm
from ..short_conv import conv as _conv
from . import single_chunk as _ssd

__all__ = ["CACHE_BLOCK_BYTES", "mamba2_inner", "mamba2_inner_applies", "mamba2_inner_ref"]


#: Bytes of one block's activations (``in_proj``'s output rows, the convolution's output and
#: its gradient, y and its gradient) that the C loops keep in cache between them: 128 KiB
#: holds two sequences of the ``budget`` model's 32 steps and one of the ``quick`` model's.
#: Measured on a 2-core Xeon (48 KiB L1, 2 MiB L2 a core), forward and backward of the three
#: loops with cold caches: one or a few sequences a block ran 1.3x faster than the whole stack
#: at a time, at widths 16 and 64 alike (``docs/performance.md``).
CACHE_BLOCK_BYTES = 1 << 17

#: The C source of the block loop, shipped beside this module (built by :mod:`dynlab.kernels.compiled`).
_C_SOURCE = (Path(__file__).parent / "mixer_inner.c").read_text(encoding="utf-8")

_I64, _PTR = ctypes.c_int64, ctypes.c_void_p
_SIGNATURES = {
    "dl_m2i_fwd_{suf}": ([_PTR] * 3 + [_I64] * 8 + [ctypes.c_double] + [_PTR] * 10, ctypes.c_int),
    "dl_m2i_bwd_{suf}": ([_PTR] * 3 + [_I64] * 8 + [ctypes.c_double] + [_PTR] * 17, ctypes.c_int),
}

_FAILED = {1: "short conv: out of memory for its scratch rows", 2: "single-chunk SSD: out of memory for [{t}, {t}] buffers",
           3: "gated norm: out of memory for its row buffers", 4: "Mamba-2 mixer: out of memory for a [{blk}, {t}, {cd}] scratch"}


def c_library() -> ctypes.CDLL | None:
    """The block loop's compiled library (``dl_m2i_fwd_*``, ``dl_m2i_bwd_*``), or None where no C compiler or ``DYNLAB_C_KERNELS=0``."""
    return typed_library("mixer_inner", _C_SOURCE, _SIGNATURES)


def _address(fn) -> int:
    """The address of a loaded C function, for the block loop's function-pointer arguments."""
    return ctypes.cast(fn, ctypes.c_void_p).value


def _sequences_per_block(t: int, w: int, cc: int, di: int, itemsize: int, nb: int) -> int:
    """How many of a member's ``nb`` sequences one block holds: as many as fit
    :data:`CACHE_BLOCK_BYTES` of ``T·(W + 2C + 2·H·P)`` elements each, at least one."""
    per_sequence = t * (w + 2 * cc + 2 * di) * itemsize
    return max(1, min(nb, CACHE_BLOCK_BYTES // per_sequence))


def _check(zxbcdt, conv_w, conv_b, dt_bias, A_log, D, norm_w, heads, head_dim, d_state) -> tuple[int, int, int]:
    """``(H·P, conv channels, W)``, or a ValueError naming the shapes that do not fit."""
    di, cc = heads * head_dim, heads * head_dim + 2 * d_state
    w = di + cc + heads
    e = zxbcdt.shape[0] if zxbcdt.dim() == 4 else -1
    if (zxbcdt.dim() != 4 or zxbcdt.shape[-1] != w or conv_w.dim() != 3 or conv_w.shape[0] != e or conv_w.shape[1] < 1
            or conv_w.shape[2] != cc or (conv_b is not None and tuple(conv_b.shape) != (e, cc))
            or any(tuple(v.shape) != (e, heads) for v in (dt_bias, A_log, D)) or tuple(norm_w.shape) != (e, di)):
        raise ValueError(f"mamba2_inner: need zxbcdt [E, B, T, {w}], conv_w [E, K ≥ 1, {cc}], conv_b [E, {cc}] or None, "
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
    float64, one dtype, at least one step, and the four libraries available."""
    return (zxbcdt.device.type == "cpu" and c_suffix(zxbcdt.dtype) is not None and zxbcdt.dim() == 4
            and zxbcdt.shape[2] > 0
            and all(o is None or (o.dtype == zxbcdt.dtype and o.device.type == "cpu") for o in others)
            and _conv.c_library() is not None and _ssd.c_library() is not None and _norm.c_library() is not None
            and c_library() is not None)


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
    """Forward: the convolution, the SSD and the gated norm's C loops, block by block of
    sequences, each reading its inputs in place from ``zxbcdt`` and the convolution's output;
    backward: the same loops' backward passes in reverse, each writing into its slice of one
    gradient of ``zxbcdt`` (``mixer_inner.c``)."""

    @staticmethod
    def forward(ctx, zxbcdt, conv_w, conv_b, dt_bias, A_log, D_rep, norm_w, eps, sizes):
        h, p, n = sizes
        di, cc = h * p, h * p + 2 * n
        e, b, t, w = zxbcdt.shape
        k = conv_w.shape[1]
        suf = c_suffix(zxbcdt.dtype)
        zx = zxbcdt.contiguous()
        dt_in = zx[..., di + cc:] + dt_bias[:, None, None, :]  # [E, B, T, H]
        dt = F.softplus(dt_in)
        A = -torch.exp(A_log)
        a_rows = A[:, None, :].expand(e, b, h).reshape(e * b, h).contiguous()  # one member: reshape keeps a 0 stride
        post = torch.empty(e, b, t, cc, dtype=zx.dtype)  # silu(conv(xBC)): x | B | C
        y = torch.empty(e * b, t, h, p, dtype=zx.dtype)
        out = torch.empty(e, b, t, di, dtype=zx.dtype)
        blk = _sequences_per_block(t, w, cc, di, zx.element_size(), b)
        status = getattr(c_library(), f"dl_m2i_fwd_{suf}")(
            *_functions(suf, "dl_sc_fwd", "dl_ssd1_fwd", "dl_gn_fwd"), e, b, t, h, p, n, k, blk, eps,
            *map(data_pointer, (zx, conv_w, conv_b, dt, a_rows, D_rep, norm_w, post, y, out)))
        if status:
            raise MemoryError(_FAILED[status].format(t=t, blk=blk, cd=cc + di))
        ctx.save_for_backward(zx, conv_w, conv_b, post, dt_in, dt, a_rows, A, y, D_rep, norm_w)
        ctx.eps, ctx.sizes, ctx.blk = eps, sizes, blk
        return out

    @staticmethod
    @first_order("mamba2_inner")
    def backward(ctx, grad_out):
        zx, conv_w, conv_b, post, dt_in, dt, a_rows, A, y, D_rep, norm_w = ctx.saved_tensors
        h, p, n = ctx.sizes
        di, cc = h * p, h * p + 2 * n
        e, b, t, w = zx.shape
        k = conv_w.shape[1]
        suf = c_suffix(zx.dtype)
        go = grad_out.contiguous()
        g_zx = torch.empty(e, b, t, w, dtype=zx.dtype)  # the gradient of in_proj's output, slice by slice
        g_dt, g_a = torch.empty_like(dt), torch.empty_like(a_rows)
        g_norm_w, g_d_rep = torch.zeros_like(norm_w), torch.zeros_like(D_rep)
        g_cw = torch.zeros_like(conv_w)
        g_cb = None if conv_b is None else torch.zeros_like(conv_b)
        status = getattr(c_library(), f"dl_m2i_bwd_{suf}")(
            *_functions(suf, "dl_gn_bwd", "dl_ssd1_bwd", "dl_sc_bwd"), e, b, t, h, p, n, k, ctx.blk, ctx.eps,
            *map(data_pointer, (zx, conv_w, conv_b, post, dt, a_rows, y, D_rep, norm_w, go, g_zx, g_dt, g_a,
                                g_d_rep, g_norm_w, g_cw, g_cb)))
        if status:
            raise MemoryError(f"backward: {_FAILED[status].format(t=t, blk=ctx.blk, cd=cc + di)}")
        g_dt_in = torch.ops.aten.softplus_backward(g_dt, dt_in, 1.0, 20.0)  # F.softplus's backward
        g_zx[..., di + cc:] = g_dt_in
        g_a_log = g_a.view(e, b, h).sum(dim=1) * A  # d(−exp(A_log)) = A dA_log
        return (g_zx, g_cw, g_cb, g_dt_in.sum(dim=(1, 2)), g_a_log, g_d_rep, g_norm_w, None, None)


def _functions(suf: str, *names: str) -> list[int]:
    """The addresses of the convolution's, the scan's and the norm's C functions ``names``
    (in that library order or its reverse) for dtype suffix ``suf``."""
    libs = {"dl_sc": _conv.c_library(), "dl_ssd1": _ssd.c_library(), "dl_gn": _norm.c_library()}
    return [_address(getattr(libs[name.rsplit("_", 1)[0]], f"{name}_{suf}")) for name in names]
