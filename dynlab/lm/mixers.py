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

Choices written down: no short causal convolution (Mamba's ``conv1d``) — the recurrent
state is then the whole memory of the layer, which is what the interventions act on;
B and C are shared by all heads of Mamba-2 (one group); the gated output is
RMS-normalised before the output projection.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.errors import DynlabInputError
from dynlab.kernels import dispatch
from dynlab.kernels.gla import gla_sequential
from dynlab.kernels.selective_scan import selective_scan_sequential
from dynlab.kernels.ssd import ssd_sequential

__all__ = ["Mamba2Mixer", "Mamba1Mixer", "GLAMixer", "MIXERS", "IMPLS"]

IMPLS = ("chunked", "sequential")


def _check_impl(impl: str) -> str:
    if impl not in IMPLS:
        raise DynlabInputError(f"impl must be one of {IMPLS}, got {impl!r}")
    return impl


def _log_uniform(n: int, low: float, high: float, generator: torch.Generator) -> torch.Tensor:
    """``n`` values log-uniform in ``[low, high]``."""
    u = torch.rand(n, generator=generator, dtype=torch.float64)
    return torch.exp(math.log(low) + u * (math.log(high) - math.log(low)))


def _inverse_softplus(y: torch.Tensor) -> torch.Tensor:
    return y + torch.log(-torch.expm1(-y))


class Mamba2Mixer(nn.Module):
    """Mamba-2 (SSD) mixer: scalar decay per head.

    Args:
        d_model: model width D.
        n_heads: heads H.
        head_dim: channels per head P (inner width H·P).
        d_state: state size N.
        chunk_size: chunk length of the chunked scan.
        impl: ``"chunked"`` or ``"sequential"`` (the reference scan).
        dt_min, dt_max: range of the initial step sizes (log-uniform); small values give
            slowly decaying heads whose state keeps growing past the training length.
    """

    def __init__(self, d_model: int, n_heads: int = 4, head_dim: int = 16, d_state: int = 16,
                 chunk_size: int = 64, impl: str = "chunked", dt_min: float = 1e-3, dt_max: float = 1e-1) -> None:
        super().__init__()
        if not 0.0 < dt_min <= dt_max:
            raise DynlabInputError(f"need 0 < dt_min <= dt_max, got dt_min={dt_min}, dt_max={dt_max}")
        self.n_heads, self.head_dim, self.d_state = n_heads, head_dim, d_state
        self.dt_min, self.dt_max = dt_min, dt_max
        self.d_inner = n_heads * head_dim
        self.chunk_size, self.impl = chunk_size, _check_impl(impl)
        self.in_proj = nn.Linear(d_model, 2 * self.d_inner + 2 * d_state + n_heads, bias=False)
        self.A_log = nn.Parameter(torch.zeros(n_heads))
        self.dt_bias = nn.Parameter(torch.zeros(n_heads))
        self.D = nn.Parameter(torch.ones(n_heads))
        self.norm = nn.RMSNorm(self.d_inner)
        self.out_proj = nn.Linear(self.d_inner, d_model, bias=False)

    def state_shape(self) -> tuple[int, int, int]:
        """``(H, P, N)`` of the state."""
        return self.n_heads, self.head_dim, self.d_state

    @torch.no_grad()
    def reset_ssm_parameters(self, generator: torch.Generator) -> None:
        """A ~ U[1, 16] (A_log = log A), dt ~ log-U[dt_min, dt_max] through softplus, D = 1."""
        a = 1.0 + 15.0 * torch.rand(self.n_heads, generator=generator, dtype=torch.float64)
        self.A_log.copy_(torch.log(a))
        self.dt_bias.copy_(_inverse_softplus(_log_uniform(self.n_heads, self.dt_min, self.dt_max, generator)))
        self.D.fill_(1.0)

    def forward(self, x: torch.Tensor, initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[B, T, D]``, initial_state ``[B, H, P, N]`` -> (y ``[B, T, D]``, final_state ``[B, H, P, N]``)."""
        b, t, _ = x.shape
        h, p, n = self.state_shape()
        z, xs, B, C, dt = torch.split(self.in_proj(x), [self.d_inner, self.d_inner, n, n, h], dim=-1)
        xs, B, C = F.silu(xs), F.silu(B), F.silu(C)
        xs = xs.view(b, t, h, p)  # [B, T, H, P]
        dt = F.softplus(dt + self.dt_bias)  # [B, T, H]
        A = -torch.exp(self.A_log)  # [H]
        B = B[:, :, None, :].expand(b, t, h, n)  # [B, T, H, N]
        C = C[:, :, None, :].expand(b, t, h, n)  # [B, T, H, N]
        if self.impl == "chunked":
            y, state = dispatch.ssd(xs, dt, A, B, C, initial_state, True, chunk_size=self.chunk_size)
        else:
            y, state = ssd_sequential(xs, dt, A, B, C, initial_state, True)
        y = y + self.D[:, None] * xs  # [B, T, H, P]
        y = self.norm(y.reshape(b, t, self.d_inner) * F.silu(z))  # [B, T, H*P]
        return self.out_proj(y), state


class Mamba1Mixer(nn.Module):
    """Mamba-1 (selective scan) mixer: diagonal decay per channel and state dim.

    Args:
        d_model: model width D.
        d_inner: inner channels (scanned independently).
        d_state: state size N per channel.
        n_heads: groups of channels used as "heads" of the state layout (divides d_inner).
        dt_rank: rank of the Δ projection (default ``ceil(d_model / 16)``).
        chunk_size, impl: ``"chunked"`` (default) runs ``dispatch.selective_scan``: on the
            CPU the fused scan with a hand-written backward (a compiled C kernel when a C
            compiler is available, see :func:`dynlab.kernels.selective_scan.selective_scan_fused`;
            ``chunk_size`` is unused there), Triton or mamba-ssm on CUDA. ``"sequential"`` is
            the step-by-step reference scan under autograd (about 10× slower on the CPU).
    """

    def __init__(self, d_model: int, d_inner: int = 64, d_state: int = 16, n_heads: int = 4,
                 dt_rank: int | None = None, chunk_size: int = 32, impl: str = "chunked") -> None:
        super().__init__()
        if d_inner % n_heads:
            raise DynlabInputError(f"n_heads must divide d_inner={d_inner}, got n_heads={n_heads}")
        self.d_inner, self.d_state, self.n_heads = d_inner, d_state, n_heads
        self.dt_rank = dt_rank or math.ceil(d_model / 16)
        self.chunk_size, self.impl = chunk_size, _check_impl(impl)
        self.in_proj = nn.Linear(d_model, 2 * d_inner, bias=False)
        self.x_proj = nn.Linear(d_inner, self.dt_rank + 2 * d_state, bias=False)
        self.dt_proj = nn.Linear(self.dt_rank, d_inner, bias=True)
        self.A_log = nn.Parameter(torch.zeros(d_inner, d_state))
        self.D = nn.Parameter(torch.ones(d_inner))
        self.norm = nn.RMSNorm(d_inner)
        self.out_proj = nn.Linear(d_inner, d_model, bias=False)

    def state_shape(self) -> tuple[int, int, int]:
        """``(H, D_inner / H, N)`` of the state."""
        return self.n_heads, self.d_inner // self.n_heads, self.d_state

    @torch.no_grad()
    def reset_ssm_parameters(self, generator: torch.Generator) -> None:
        """A[d, n] = n + 1 (S4D-real, A_log = log A), Δ bias ~ log-U[1e-3, 1e-1] through softplus, D = 1."""
        a = torch.arange(1, self.d_state + 1, dtype=torch.float64).expand(self.d_inner, -1)
        self.A_log.copy_(torch.log(a))
        self.dt_proj.bias.copy_(_inverse_softplus(_log_uniform(self.d_inner, 1e-3, 1e-1, generator)))
        self.D.fill_(1.0)

    def forward(self, x: torch.Tensor, initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[B, T, D]``, initial_state ``[B, H, D_inner/H, N]`` -> (y ``[B, T, D]``, final_state, same layout)."""
        b, t, _ = x.shape
        xs, z = self.in_proj(x).chunk(2, dim=-1)
        xs = F.silu(xs)  # [B, T, D_inner]
        dt_raw, B, C = torch.split(self.x_proj(xs), [self.dt_rank, self.d_state, self.d_state], dim=-1)
        delta = F.softplus(self.dt_proj(dt_raw))  # [B, T, D_inner]
        A = -torch.exp(self.A_log)  # [D_inner, N]
        init = None if initial_state is None else initial_state.reshape(b, self.d_inner, self.d_state)
        if self.impl == "chunked":
            y, state = dispatch.selective_scan(xs, delta, A, B, C, init, True, chunk_size=self.chunk_size)
        else:
            y, state = selective_scan_sequential(xs, delta, A, B, C, init, True)
        y = self.norm((y + self.D * xs) * F.silu(z))  # [B, T, D_inner]
        return self.out_proj(y), state.view(b, *self.state_shape())  # [B, H, D_inner/H, N]


class GLAMixer(nn.Module):
    """Gated linear attention mixer.

    Log forget gates ``g = logsigmoid(W_g x) / 16`` (GLA's gate normaliser), output gate
    ``silu(W_o x)``, per-head keys of size ``key_dim`` and values of size ``value_dim``.
    """

    gate_normalizer = 16.0

    def __init__(self, d_model: int, n_heads: int = 4, key_dim: int = 16, value_dim: int = 16,
                 chunk_size: int = 32, impl: str = "chunked") -> None:
        super().__init__()
        self.n_heads, self.key_dim, self.value_dim = n_heads, key_dim, value_dim
        self.chunk_size, self.impl = chunk_size, _check_impl(impl)
        hk, hv = n_heads * key_dim, n_heads * value_dim
        self.qkvg_proj = nn.Linear(d_model, 3 * hk + 2 * hv, bias=False)
        self.norm = nn.RMSNorm(hv)
        self.out_proj = nn.Linear(hv, d_model, bias=False)

    def state_shape(self) -> tuple[int, int, int]:
        """``(H, K, V)`` of the state."""
        return self.n_heads, self.key_dim, self.value_dim

    @torch.no_grad()
    def reset_ssm_parameters(self, generator: torch.Generator) -> None:
        """GLA has no extra recurrence parameters (the gate is a plain projection)."""

    def forward(self, x: torch.Tensor, initial_state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """x ``[B, T, D]``, initial_state ``[B, H, K, V]`` -> (y ``[B, T, D]``, final_state ``[B, H, K, V]``)."""
        b, t, _ = x.shape
        h, dk, dv = self.state_shape()
        q, k, g, v, o = torch.split(self.qkvg_proj(x), [h * dk, h * dk, h * dk, h * dv, h * dv], dim=-1)
        q, k, g = (a.view(b, t, h, dk) for a in (q, k, g))  # [B, T, H, K]
        v = v.view(b, t, h, dv)  # [B, T, H, V]
        gk = F.logsigmoid(g) / self.gate_normalizer
        if self.impl == "chunked":
            y, state = dispatch.gla(q, k, v, gk, None, initial_state, True, chunk_size=self.chunk_size)
        else:
            y, state = gla_sequential(q, k, v, gk, None, initial_state, True)
        y = self.norm(y.reshape(b, t, h * dv) * F.silu(o))  # [B, T, H*V]
        return self.out_proj(y), state


MIXERS: dict[str, type[nn.Module]] = {"mamba2": Mamba2Mixer, "mamba1": Mamba1Mixer, "gla": GLAMixer}
