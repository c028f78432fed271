"""Sequence mixers for the small LM stack, wrapping the scans in ``dynlab.kernels``.

Every mixer maps ``x [B, T, D] -> y [B, T, D]`` and carries a recurrent state in one
uniform layout ``[B, H, P, N]`` (batch, head, per-head channel, state dim), so the
initial-state interventions and the state statistics (docs/length-generalization.md) treat all mixers
alike:

- :class:`Mamba2Mixer` — SSD, scalar decay per head; native state ``[B, H, P, N]``.
- :class:`Mamba1Mixer` — selective scan, diagonal decay per channel and state dim; the
  native ``[B, D_inner, N]`` state is grouped into ``n_heads`` heads of ``D_inner / n_heads``
  channels, ``[B, H, D_inner/H, N]`` (the grouping only matters for per-head statistics).
- :class:`GLAMixer` — gated linear attention; state ``[B, H, K, V]``.

Every mixer has the short causal depthwise convolution of the real layers (width
``conv_kernel``, default 4; ``0`` turns it off), followed by SiLU:

- Mamba-2 convolves ``x``, ``B`` and ``C`` together (mamba-ssm's ``conv1d`` over ``xBC``);
- Mamba-1 convolves ``x`` (mamba-ssm's ``conv1d``);
- GLA convolves ``q``, ``k`` and ``v`` (flash-linear-attention's ``use_short_conv``; fla's
  default is no convolution, dynlab's is width 4 as zoology puts one before every mixer).

The convolution's window (its last ``K − 1`` inputs) is part of the recurrent state:
``forward`` takes and returns it beside the SSM state (:mod:`dynlab.lm.models.states`), so a
text streamed in chunks gives the same outputs as in one piece.

Other choices written down: B and C are shared by all heads of Mamba-2 (one group, HF's
``n_groups = 1``); Mamba-2's gated output is RMS-normalised before the output projection
(``norm(y · silu(z))``, as mamba-ssm and HF); Mamba-1 has no such norm (as mamba-ssm and
HF; ``inner_norm=True`` restores the norm of dynlab's convolution-free layout, which old
run folders use).  ``norm_eps`` is the epsilon of every RMSNorm (None: the dtype's machine
epsilon, the layout of old run folders).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from contextlib import nullcontext
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.errors import DynlabInputError
from dynlab.kernels import dispatch
from dynlab.kernels.gla.chunked import gla_ref
from dynlab.kernels.selective_scan.chunked import selective_scan_ref
from dynlab.kernels.ssd.chunked import ssd_ref

__all__ = ["Mamba2Mixer", "Mamba1Mixer", "GLAMixer", "MIXERS", "IMPLS", "causal_conv", "causal_conv_ref"]

#: What a mixer's scan runs: ``"dispatch"``, the fast path :mod:`dynlab.kernels.dispatch`
#: picks for the device (the op's torch form on the CPU, Triton or mamba-ssm on CUDA);
#: ``"ref"``, the op's plain-torch reference (``ssd_ref``, ``selective_scan_ref``,
#: ``gla_ref``) under autograd.
IMPLS = ("dispatch", "ref")


def _check_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise DynlabInputError(f"unknown impl {impl!r}; allowed: {', '.join(IMPLS)}")
    return impl


def _log_uniform(n: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """``n`` values log-uniform in ``[low, high]``."""
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    return torch.exp(math.log(low) + u * (math.log(high) - math.log(low)))


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


def causal_conv(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Causal depthwise convolution over time, then SiLU, from a carried window.

    Args:
        x: ``[B, T, C]`` inputs.
        weight: ``[C, 1, K]`` (``nn.Conv1d(C, C, K, groups=C).weight``); tap ``K − 1``
            multiplies the current input, tap ``0`` the input ``K − 1`` steps back.
        bias: ``[C]`` or None.
        window: ``[B, C, K − 1]``, the ``K − 1`` inputs before ``x`` (None: zeros).

    Returns ``(silu(conv) [B, T, C], new window [B, C, K − 1])`` — the last ``K − 1``
    inputs seen, the window for the next chunk.

    The convolution is computed as K shifted multiply-adds over the time axis in the
    ``[B, T, C]`` layout: for the short widths of these mixers (K ≤ 8) and small channel
    counts this runs forward and backward about 1.2× faster per LM training step on the
    CPU than ``F.conv1d`` (benchmarks/bench_lm_mixers.py), and it equals it to rounding.
    """
    b, t, c = x.shape
    k = weight.shape[-1]
    past = x.new_zeros(b, k - 1, c) if window is None else window.to(x.dtype).transpose(1, 2)
    full = torch.cat([past, x], dim=1)  # [B, K - 1 + T, C]
    taps = weight[:, 0, :].t()  # [K, C]
    y = full[:, 0:t] * taps[0]
    for j in range(1, k):
        y = y + full[:, j:j + t] * taps[j]
    if bias is not None:
        y = y + bias
    return F.silu(y), full[:, t:].transpose(1, 2)


def causal_conv_ref(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None,
                    window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`causal_conv` as an explicit sum over taps, step by step (the reference)."""
    b, t, c = x.shape
    k = weight.shape[-1]
    past = [x.new_zeros(b, c) for _ in range(k - 1)] if window is None else list(window.to(x.dtype).unbind(-1))
    ys = []
    for i in range(t):
        past.append(x[:, i])
        taps = past[len(past) - k:]
        y = sum(weight[:, 0, j] * taps[j] for j in range(k))
        ys.append(y if bias is None else y + bias)
    out = torch.stack(ys, dim=1)  # [B, T, C]
    return F.silu(out), torch.stack(past[len(past) - (k - 1):], dim=-1) if k > 1 else x.new_zeros(b, c, 0)



def run_scan(x: torch.Tensor, impl: str, fast: Callable[..., Any], ref: Callable[..., Any], args: tuple,
             chunk_size: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A mixer's scan with its final state: ``fast(*args, True, chunk_size=…)`` (the
    dispatched kernel) for ``impl = "dispatch"``, else the reference ``ref(*args, True)``.

    Under ``torch.autocast`` (``--precision bf16``) autocast is off for the scan and its
    bfloat16/float16 inputs are cast up to float32, so that the recurrent state
    accumulates in float32 (the chunked forms' matrix products would otherwise run in
    bfloat16); without autocast the inputs are as they are (every float32 model computes
    as before)."""
    autocast = torch.is_autocast_enabled(x.device.type)
    if autocast:
        low = (torch.bfloat16, torch.float16)
        args = tuple(a.float() if isinstance(a, torch.Tensor) and a.dtype in low else a for a in args)
    with torch.autocast(x.device.type, enabled=False) if autocast else nullcontext():
        if impl == "dispatch":
            return fast(*args, True, chunk_size=chunk_size)
        return ref(*args, True)

class _ShortConv(nn.Module):
    """Holds ``conv1d`` (depthwise, width ``kernel``) and applies :func:`causal_conv`; kernel 0: SiLU only."""

    def _init_conv(self, channels: int, kernel: int, bias: bool) -> None:
        if kernel < 0:
            raise DynlabInputError(f"conv_kernel must be >= 0 (0: no convolution), got {kernel}")
        self.conv_kernel = kernel
        self.conv1d = nn.Conv1d(channels, channels, kernel, groups=channels, bias=bias) if kernel else None

    def conv_shape(self) -> tuple[int, int] | None:
        """``(C, K − 1)`` of the convolution window, None without a convolution."""
        return None if self.conv1d is None else (self.conv1d.in_channels, self.conv_kernel - 1)

    def _conv(self, x: torch.Tensor, window: torch.Tensor | None) -> tuple[torch.Tensor, torch.Tensor | None]:
        if self.conv1d is None:
            return F.silu(x), None
        if dispatch.conv_backend(x.device, x.dtype, self.conv_kernel, x.shape[-1]) == "causal_conv1d":  # CUDA, causal-conv1d
            return dispatch.causal_conv1d_silu(x, self.conv1d.weight, self.conv1d.bias, window)
        return causal_conv(x, self.conv1d.weight, self.conv1d.bias, window)

    @torch.no_grad()
    def _reset_conv(self, generator: torch.Generator) -> None:
        """PyTorch's default ``Conv1d`` init (as mamba-ssm): weight and bias ~ U[−1/√K, 1/√K]."""
        if self.conv1d is None:
            return
        bound = 1.0 / math.sqrt(self.conv_kernel)
        for p in (self.conv1d.weight, self.conv1d.bias):
            if p is not None:
                p.copy_((torch.rand(p.shape, generator=generator, dtype=torch.float64) * 2 - 1) * bound)


class Mamba2Mixer(_ShortConv):
    """Mamba-2 (SSD) mixer: scalar decay per head.

    Args:
        d_model: model width D.
        n_heads: heads H.
        head_dim: channels per head P (inner width H·P).
        d_state: state size N.
        chunk_size: chunk length of the chunked scan.
        impl: ``"dispatch"`` (``dispatch.ssd``: the chunked torch scan on the CPU, Triton or
            mamba-ssm on CUDA) or ``"ref"`` (:func:`dynlab.kernels.ssd.chunked.ssd_ref`, the reference).
        dt_min, dt_max: range of the initial step sizes (log-uniform); small values give
            slowly decaying heads whose state keeps growing past the training length.
        conv_kernel: width K of the causal depthwise convolution over ``xBC`` (0: none).
        norm_eps: epsilon of the gated RMSNorm (None: the dtype's machine epsilon).
    """

    def __init__(self, d_model: int, n_heads: int = 4, head_dim: int = 16, d_state: int = 16,
                 chunk_size: int = 64, impl: str = "dispatch", dt_min: float = 1e-3, dt_max: float = 1e-1,
                 conv_kernel: int = 4, norm_eps: float | None = 1e-5) -> None:
        super().__init__()
        if not 0.0 < dt_min <= dt_max:
            raise DynlabInputError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        self.n_heads, self.head_dim, self.d_state = n_heads, head_dim, d_state
        self.dt_min, self.dt_max = dt_min, dt_max
        self.d_inner = n_heads * head_dim
        self.chunk_size, self.impl = chunk_size, _check_impl(impl)
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * d_state + n_heads, bias=False)
        self._init_conv(self.d_inner + 2 * d_state, conv_kernel, bias=True)
        self.A_log = nn.Parameter(torch.zeros(n_heads))
        self.dt_bias = nn.Parameter(torch.zeros(n_heads))
        self.D = nn.Parameter(torch.ones(n_heads))
        self.norm = nn.RMSNorm(self.d_inner, eps=norm_eps)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def state_shape(self) -> tuple[int, int, int]:
        """``(H, P, N)`` of the state."""
        return self.n_heads, self.head_dim, self.d_state

    @torch.no_grad()
    def reset_ssm_parameters(self, generator: torch.Generator) -> None:
        """A ~ U[1, 16] (A_log = log A), dt ~ log-U[dt_min, dt_max] through softplus, D = 1; the convolution as PyTorch's default."""
        a = 1.0 + 15.0 * torch.rand(self.n_heads, generator=generator, dtype=torch.float64)
        self.A_log.copy_(torch.log(a))
        self.dt_bias.copy_(_inverse_softplus(_log_uniform(self.n_heads, self.dt_min, self.dt_max, generator)))
        self.D.fill_(1.0)
        self._reset_conv(generator)

    def forward(self, x: torch.Tensor, initial_state: torch.Tensor | None = None,
                conv_window: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x ``[B, T, D]``, initial_state ``[B, H, P, N]``, conv_window ``[B, H·P + 2N, K − 1]``
        -> (y ``[B, T, D]``, final_state ``[B, H, P, N]``, final window or None)."""
        y, z, state, window = self.inner(x, initial_state, conv_window)
        b, t = x.shape[:2]
        y = self.norm(y.reshape(b, t, self.d_inner) * F.silu(z))  # [B, T, H*P]
        return self.out_proj(y), state, window

    def inner(self, x: torch.Tensor, initial_state: torch.Tensor | None = None, conv_window: torch.Tensor | None = None):
        """The mixer up to the gated norm: ``(y + D·x [B, T, H, P], z [B, T, H·P], final state, final window)``."""
        b, t, _ = x.shape
        h, p, n = self.state_shape()
        z, xbc, dt = torch.split(self.in_proj(x), [self.d_inner, self.d_inner + 2 * n, h], dim=-1)
        xbc, window = self._conv(xbc, conv_window)  # [B, T, H*P + 2N]
        xs, B, C = torch.split(xbc, [self.d_inner, n, n], dim=-1)
        xs = xs.reshape(b, t, h, p)  # [B, T, H, P]
        dt = F.softplus(dt + self.dt_bias)  # [B, T, H]
        A = -torch.exp(self.A_log)  # [H]
        B = B[:, :, None, :].expand(b, t, h, n)  # [B, T, H, N]
        C = C[:, :, None, :].expand(b, t, h, n)  # [B, T, H, N]
        initial_state = None if initial_state is None else initial_state.to(x.dtype)  # as the stack, and the window
        y, state = run_scan(x, self.impl, dispatch.ssd, ssd_ref, (xs, dt, A, B, C, initial_state), self.chunk_size)
        return y + self.D[:, None] * xs, z, state, window


class Mamba1Mixer(_ShortConv):
    """Mamba-1 (selective scan) mixer: diagonal decay per channel and state dim.

    Args:
        d_model: model width D.
        d_inner: inner channels (scanned independently).
        d_state: state size N per channel.
        n_heads: groups of channels used as "heads" of the state layout (divides d_inner).
        dt_rank: rank of the Δ projection (default ``ceil(d_model / 16)``).
        chunk_size, impl: ``"dispatch"`` (default) runs ``dispatch.selective_scan``: on the
            CPU the fused scan with a hand-written backward (a compiled C kernel when a C
            compiler is available, see :func:`dynlab.kernels.selective_scan.chunked.selective_scan_fused`;
            ``chunk_size`` is unused there), Triton or mamba-ssm on CUDA. ``"ref"`` is
            :func:`dynlab.kernels.selective_scan.chunked.selective_scan_ref`, the step-by-step reference
            scan under autograd.
        conv_kernel: width K of the causal depthwise convolution over ``x`` (0: none).
        inner_norm: RMS-normalise the gated output before ``out_proj`` (not in mamba-ssm
            or HF; the layout of dynlab's old convolution-free runs).
        norm_eps: epsilon of that norm (None: the dtype's machine epsilon).
    """

    def __init__(self, d_model: int, d_inner: int = 64, d_state: int = 16, n_heads: int = 4,
                 dt_rank: int | None = None, chunk_size: int = 32, impl: str = "dispatch",
                 conv_kernel: int = 4, inner_norm: bool = False, norm_eps: float | None = 1e-5) -> None:
        super().__init__()
        if d_inner % n_heads:
            raise DynlabInputError(f"n_heads must divide d_inner={d_inner}, got n_heads={n_heads}")
        self.d_inner, self.d_state, self.n_heads = d_inner, d_state, n_heads
        self.dt_rank = dt_rank or math.ceil(d_model / 16)
        self.chunk_size, self.impl = chunk_size, _check_impl(impl)
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self._init_conv(d_inner, conv_kernel, bias=True)
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner, bias=True)
        self.A_log = nn.Parameter(torch.zeros(d_inner, d_state))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.norm = nn.RMSNorm(d_inner, eps=norm_eps) if inner_norm else None
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def state_shape(self) -> tuple[int, int, int]:
        """``(H, D_inner / H, N)`` of the state."""
        return self.n_heads, self.d_inner // self.n_heads, self.d_state

    @torch.no_grad()
    def reset_ssm_parameters(self, generator: torch.Generator) -> None:
        """A[d, n] = n + 1 (S4D-real, A_log = log A), Δ bias ~ log-U[1e-3, 1e-1] through softplus, D = 1; the convolution as PyTorch's default."""
        a = torch.arange(1, self.d_state + 1, dtype=torch.float64).expand(self.d_inner, -1)
        self.A_log.copy_(torch.log(a))
        self.dt_proj.bias.copy_(_inverse_softplus(_log_uniform(self.d_inner, 1e-3, 1e-1, generator)))
        self.D.fill_(1.0)
        self._reset_conv(generator)

    def forward(self, x: torch.Tensor, initial_state: torch.Tensor | None = None,
                conv_window: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x ``[B, T, D]``, initial_state ``[B, H, D_inner/H, N]``, conv_window ``[B, D_inner, K − 1]``
        -> (y ``[B, T, D]``, final_state (same layout), final window or None)."""
        b, t, _ = x.shape
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        xs, window = self._conv(xs, conv_window)  # [B, T, D_inner]
        dt_raw, B, C = torch.split(self.x_proj(xs), [self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt_raw))  # [B, T, D_inner]
        A = -torch.exp(self.A_log)  # [D_inner, N]
        init = None if initial_state is None else initial_state.to(x.dtype).reshape(b, self.d_inner, self.d_state)
        y, state = run_scan(x, self.impl, dispatch.selective_scan, selective_scan_ref, (xs, delta, A, B, C, init),
                            self.chunk_size)
        y = (y + self.D * xs) * F.silu(z)  # [B, T, D_inner]
        if self.norm is not None:
            y = self.norm(y)
        return self.out_proj(y), state.view(b, *self.state_shape()), window  # [B, H, D_inner/H, N]


class GLAMixer(_ShortConv):
    """Gated linear attention mixer.

    Log forget gates ``g = logsigmoid(W_g x) / 16`` (GLA's gate normaliser), output gate
    ``silu(W_o x)``, per-head keys of size ``key_dim`` and values of size ``value_dim``.
    ``conv_kernel`` > 0 puts a causal depthwise convolution (no bias) and SiLU on q, k and v
    (fla's ``use_short_conv``); 0 leaves them linear, as fla's default.  ``impl``:
    ``"dispatch"`` (``dispatch.gla``) or ``"ref"`` (:func:`dynlab.kernels.gla.chunked.gla_ref`).
    """

    gate_normalizer = 16.0

    def __init__(self, d_model: int, n_heads: int = 4, key_dim: int = 16, value_dim: int = 16,
                 chunk_size: int = 32, impl: str = "dispatch", conv_kernel: int = 4,
                 norm_eps: float | None = 1e-5) -> None:
        super().__init__()
        self.n_heads, self.key_dim, self.value_dim = n_heads, key_dim, value_dim
        self.chunk_size, self.impl = chunk_size, _check_impl(impl)
        hk, hv = n_heads * key_dim, n_heads * value_dim
        self.qkvg_proj = nn.Linear(d_model, 3 * hk + 2 * hv, bias=False)
        self._init_conv(2 * hk + hv, conv_kernel, bias=False)
        self.norm = nn.RMSNorm(hv, eps=norm_eps)
        self.out_proj = nn.Linear(hv, d_model, bias=False)

    def state_shape(self) -> tuple[int, int, int]:
        """``(H, K, V)`` of the state."""
        return self.n_heads, self.key_dim, self.value_dim

    @torch.no_grad()
    def reset_ssm_parameters(self, generator: torch.Generator) -> None:
        """GLA has no extra recurrence parameters (the gate is a plain projection); the convolution as PyTorch's default."""
        self._reset_conv(generator)

    def forward(self, x: torch.Tensor, initial_state: torch.Tensor | None = None,
                conv_window: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor | None]:
        """x ``[B, T, D]``, initial_state ``[B, H, K, V]``, conv_window ``[B, 2·H·K + H·V, K_conv − 1]``
        -> (y ``[B, T, D]``, final_state ``[B, H, K, V]``, final window or None)."""
        b, t, _ = x.shape
        h, dk, dv = self.state_shape()
        q, k, g, v, o = torch.split(self.qkvg_proj(x), [h * dk, h * dk, h * dk, h * dv, h * dv], dim=-1)
        window = None
        if self.conv1d is not None:
            qkv, window = self._conv(torch.cat([q, k, v], dim=-1), conv_window)
            q, k, v = torch.split(qkv, [h * dk, h * dk, h * dv], dim=-1)
        q, k, g = (a.reshape(b, t, h, dk) for a in (q, k, g))  # [B, T, H, K]
        v = v.reshape(b, t, h, dv)  # [B, T, H, V]
        gk = F.logsigmoid(g) / self.gate_normalizer
        initial_state = None if initial_state is None else initial_state.to(x.dtype)  # as the stack, and the window
        y, state = run_scan(x, self.impl, dispatch.gla, gla_ref, (q, k, v, gk, None, initial_state), self.chunk_size)
        y = self.norm(y.reshape(b, t, h * dv) * F.silu(o))  # [B, T, H*V]
        return self.out_proj(y), state, window


MIXERS: dict[str, type[nn.Module]] = {"mamba2": Mamba2Mixer, "mamba1": Mamba1Mixer, "gla": GLAMixer}
