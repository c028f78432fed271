"""The built-in recurrent cells of paper A (their equations and sources in docs/choices.md):
the dense RNNs (linear, token-gated, tanh, state-gated) and the diagonal cells (Mamba,
negative Mamba, AUSSM, Mamba-3).  Each is a :class:`dynlab.tracking.models.cell_base.Cell`
(that module's docstring: the three pieces of a cell, the return order, the kernels a cell
class declares); each class docstring gives its recurrence.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.kernels.dispatch import linear_scan  # Triton on CUDA, the chunked torch scan on the CPU
from dynlab.kernels.scan.chunked import dense_rnn_scan
from dynlab.tracking.models.cell_base import Cell, Terms
from dynlab.tracking.models.nonlinearity import apply_phi

__all__ = [
    "AUSSMCell",
    "LinearRNNCell",
    "Mamba3Cell",
    "MambaCell",
    "NegativeMambaCell",
    "StateGatedRNNCell",
    "TanhRNNCell",
    "TokenGatedRNNCell",
]


def _orthogonal(n: int, scale: float = 1.0) -> torch.Tensor:
    w = torch.empty(n, n)
    nn.init.orthogonal_(w)
    return w * scale


class _DenseRNN(Cell):
    """Shared parameters of the dense RNN cells: A [S, S], B [S, D], b [S]."""

    pointwise_precompute = True

    def __init__(self, d_in: int, hidden: int, nonlinearity: str | None = None, **_: object):
        super().__init__(d_in, hidden, hidden, hidden, nonlinearity)
        self.A = nn.Parameter(_orthogonal(hidden))
        self.B = nn.Linear(d_in, hidden)

    def _ah(self, h: torch.Tensor) -> torch.Tensor:
        return h @ self.A.T  # [B, S]

    def _gate(self, p: Terms) -> torch.Tensor | None:
        """The token gate σ(W_g x̃_t + b_g) ``[B, T, S]`` the dense scan multiplies A h_{t−1}
        by, or None (no gate)."""
        return None

    def fast_scan_ok(self) -> bool:
        """The dense scan takes phi ∈ {identity, tanh} (see :meth:`Cell.fast_scan_ok`)."""
        return type(self).fast_scan and self.phi in ("identity", "tanh")

    def scan(self, h0: torch.Tensor, p: Terms) -> torch.Tensor:
        """Fused dense scan for phi ∈ {identity, tanh}; the generic loop otherwise."""
        if not self.fast_scan_ok():
            return super().scan(h0, p)
        return dense_rnn_scan(p["drive"], self.A, h0, self._gate(p), self.phi)


class LinearRNNCell(_DenseRNN):
    """linear-rnn: h_t = phi(A h_{t-1} + B x̃_t + b); A dense, input-independent."""

    family = "affine"
    fast_scan = True
    fused = "dense"

    def precompute(self, u: torch.Tensor) -> Terms:
        return {"drive": self.B(u)}

    def transition(self, h: torch.Tensor, p: Terms) -> torch.Tensor:
        return apply_phi(self.phi, self._ah(h) + p["drive"])


class TokenGatedRNNCell(_DenseRNN):
    """token-gated-rnn: h_t = phi(σ(W_g x̃_t + b_g) ⊙ (A h_{t-1}) + B x̃_t + b).

    The gate depends on the token only, so the state Jacobian diag(g_t)·A does not
    depend on h: an affine tracker.
    """

    family = "affine"
    fast_scan = True
    fused = "token-gated"

    def __init__(self, d_in: int, hidden: int, nonlinearity: str | None = None, **kw: object):
        super().__init__(d_in, hidden, nonlinearity, **kw)
        self.W_g = nn.Linear(d_in, hidden)
        nn.init.constant_(self.W_g.bias, 2.0)

    def precompute(self, u: torch.Tensor) -> Terms:
        return {"gate": torch.sigmoid(self.W_g(u)), "drive": self.B(u)}

    def transition(self, h: torch.Tensor, p: Terms) -> torch.Tensor:
        return apply_phi(self.phi, p["gate"] * self._ah(h) + p["drive"])

    def _gate(self, p: Terms) -> torch.Tensor | None:
        return p["gate"]


class TanhRNNCell(_DenseRNN):
    """tanh-rnn: h_t = phi(A h_{t-1} + B x̃_t + b), phi = tanh by default."""

    family = "state-dependent"
    default_phi = "tanh"
    fast_scan = True
    fused = "dense"

    def precompute(self, u: torch.Tensor) -> Terms:
        return {"drive": self.B(u)}

    def transition(self, h: torch.Tensor, p: Terms) -> torch.Tensor:
        return apply_phi(self.phi, self._ah(h) + p["drive"])


class StateGatedRNNCell(_DenseRNN):
    """state-gated-rnn: h_t = phi(σ(U_g h_{t-1} + W_g x̃_t + b_g) ⊙ (A h_{t-1}) + B x̃_t + b).

    The gate reads the state, so the Jacobian depends on h even with phi = identity;
    phi = tanh by default keeps the state bounded.  No fast scan (the dense scan has no
    state-dependent gate): :meth:`scan` is the generic loop; training runs the fused kernel.
    """

    family = "state-dependent"
    default_phi = "tanh"
    fused = "state-gated"

    def __init__(self, d_in: int, hidden: int, nonlinearity: str | None = None, **kw: object):
        super().__init__(d_in, hidden, nonlinearity, **kw)
        self.U_g = nn.Parameter(torch.randn(hidden, hidden) / math.sqrt(hidden))
        self.W_g = nn.Linear(d_in, hidden)
        nn.init.constant_(self.W_g.bias, 1.0)

    def precompute(self, u: torch.Tensor) -> Terms:
        return {"gate_in": self.W_g(u), "drive": self.B(u)}

    def transition(self, h: torch.Tensor, p: Terms) -> torch.Tensor:
        gate = torch.sigmoid(h @ self.U_g.T + p["gate_in"])
        return apply_phi(self.phi, gate * self._ah(h) + p["drive"])


class MambaCell(Cell):
    """mamba (S6 selective SSM), diagonal per channel.

    With H = ``hidden`` channels and N = ``d_state`` states per channel:
    x_t = W_x x̃_t, z_t = W_z x̃_t, Δ_t = softplus(W_Δ x̃_t + b_Δ) [H], B_t = W_B x̃_t [N],
    C_t = W_C x̃_t [N], a = −exp(a_log) [H, N],
    h_t[d, n] = Ā_t[d, n]·h_{t−1}[d, n] + Δ_t[d]·x_t[d]·B_t[n] with Ā_t = exp(Δ_t a) ∈ (0, 1),
    y_t[d] = (Σ_n C_t[n]·h_t[d, n] + D[d]·x_t[d])·silu(z_t[d]).
    The state is flattened to S = H·N.
    """

    family = "affine"
    pointwise_precompute = True
    fast_scan = True
    fused = "diagonal"

    def __init__(self, d_in: int, hidden: int, nonlinearity: str | None = None, d_state: int = 4, **_: object):
        super().__init__(d_in, hidden, hidden * d_state, hidden, nonlinearity)
        self.d_state = d_state
        self.W_x = nn.Linear(d_in, hidden)
        self.W_z = nn.Linear(d_in, hidden)
        self.W_dt = nn.Linear(d_in, hidden)
        self.W_B = nn.Linear(d_in, d_state, bias=False)
        self.W_C = nn.Linear(d_in, d_state, bias=False)
        self.a_log = nn.Parameter(torch.log(torch.arange(1, d_state + 1, dtype=torch.float32)).repeat(hidden, 1))
        self.D = nn.Parameter(torch.ones(hidden))
        # Δ initialised in [1e-3, 1e-1] as in Mamba (inverse softplus of a log-uniform draw).
        dt = torch.exp(torch.rand(hidden) * (math.log(0.1) - math.log(1e-3)) + math.log(1e-3))
        with torch.no_grad():
            self.W_dt.bias.copy_(dt + torch.log(-torch.expm1(-dt)))

    def _decay(self, dt: torch.Tensor) -> torch.Tensor:  # dt [B, T, H] -> [B, T, H, N]
        return torch.exp(dt[..., None] * -torch.exp(self.a_log))

    def precompute(self, u: torch.Tensor) -> Terms:
        x = self.W_x(u)  # [B, T, H]
        dt = F.softplus(self.W_dt(u))  # [B, T, H]
        b_t = self.W_B(u)  # [B, T, N]
        decay = self._decay(dt)  # [B, T, H, N]
        drive = (dt * x)[..., None] * b_t[..., None, :]  # [B, T, H, N]
        return {
            "decay": decay.flatten(-2),  # [B, T, S]
            "drive": drive.flatten(-2),  # [B, T, S]
            "x": x,
            "z": self.W_z(u),
            "C": self.W_C(u),
        }

    def transition(self, h: torch.Tensor, p: Terms) -> torch.Tensor:
        return apply_phi(self.phi, p["decay"] * h + p["drive"])

    def scan(self, h0: torch.Tensor, p: Terms) -> torch.Tensor:
        """Chunked diagonal scan when phi is the identity; the generic loop otherwise."""
        if not self.fast_scan_ok():
            return super().scan(h0, p)
        return linear_scan(p["decay"], p["drive"], h0)

    def readout(self, hs: torch.Tensor, p: Terms) -> torch.Tensor:
        h = hs.unflatten(-1, (self.hidden, self.d_state))  # [B, T, H, N]
        # Σ_n C_t[n]·h_t[d, n] as a broadcast product summed over the short last axis: at
        # B=256, T=60, H=128, N=4 its forward and backward took 0.11–0.18 s against 0.27–0.36 s
        # for the einsum (one batched matrix-vector product per (b, t)), 1 thread, one run.
        y = (h * p["C"][..., None, :]).sum(-1) + self.D * p["x"]  # [B, T, H]
        return y * F.silu(p["z"])

    def diagonal_tables(self, p: Terms, params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Tables of the fused kernel (:mod:`dynlab.kernels.tracker_loss.diagonal`) from the terms
        ``p`` over the vocabulary (``[V, …]``) and the cell's parameters ``params`` (by
        name): a = decay, b = drive ``[V, H, N]``, C ``[V, N]``, g = silu(z) and
        e = D·x·silu(z) ``[V, H]``, so that g·(C·h) + e is :meth:`readout`."""
        v = p["x"].shape[0]
        gate = F.silu(p["z"])
        a, b = (p[name].reshape(v, self.hidden, self.d_state) for name in ("decay", "drive"))
        return a, b, p["C"], gate, params["D"] * p["x"] * gate


class NegativeMambaCell(MambaCell):
    """negative-mamba: Mamba with Ā′_t = 2·exp(Δ_t a) − 1 ∈ (−1, 1) (Grazzi et al.)."""

    fast_scan = True  # the decay is a precomputed term: the diagonal scan still applies
    fused = "diagonal"  # and the fused kernel too (it reads the precomputed terms)

    def _decay(self, dt: torch.Tensor) -> torch.Tensor:
        return 2.0 * torch.exp(dt[..., None] * -torch.exp(self.a_log)) - 1.0


def _rotate(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Multiply complex pairs ``h [B, H, 2]`` by e^{iθ} given cos θ, sin θ ``[B, H]``."""
    re, im = h[..., 0], h[..., 1]
    return torch.stack([re * cos - im * sin, re * sin + im * cos], dim=-1)


def _rotation_scan(h0: torch.Tensor, p: Terms) -> torch.Tensor:
    """States ``[B, T, 2H]`` of h_t = (cos_t + i·sin_t)·h_{t−1} + drive_t as a complex scan.

    ``h0 [B, 2H]`` and ``drive [B, T, 2H]`` hold (real, imaginary) pairs; ``cos, sin
    [B, T, H]`` (already scaled by the decay for Mamba-3).
    """
    a = torch.complex(p["cos"], p["sin"])  # [B, T, H]
    # (real, imaginary) pairs read as complex numbers in place: views whose backward is a
    # view too (selecting [..., 0] and [..., 1] would zero-fill a full-size gradient each)
    b = _as_complex(p["drive"].unflatten(-1, (-1, 2)))  # [B, T, H]
    hs = linear_scan(a, b, _as_complex(h0.unflatten(-1, (-1, 2))))  # [B, T, H] complex
    return torch.view_as_real(hs).flatten(-2)  # [B, T, 2H]


def _as_complex(pairs: torch.Tensor) -> torch.Tensor:
    """``[..., 2]`` real pairs as complex ``[...]``: a view when the strides allow it."""
    if pairs.stride(-1) != 1 or any(st % 2 for st in pairs.stride()[:-1]) or pairs.storage_offset() % 2:
        pairs = pairs.clone(memory_format=torch.contiguous_format)  # a fresh copy: offset 0, unit strides
    return torch.view_as_complex(pairs)


class AUSSMCell(Cell):
    """aussm (adaptive unitary SSM), complex diagonal with |eigenvalue| = 1.

    θ_t = W_A x̃_t + b (b ~ U(−π, π)), Δ_t = softplus(W_Δ x̃_t + b_Δ), x_t = W_x x̃_t,
    h_t = e^{iθ_t} ⊙ h_{t−1} + Δ_t·B·silu(x_t) with B ∈ ℂ^H input-independent,
    y_t = Re(C ⊙ h_t) + D·silu(x_t).  No contraction: the transition is unitary.
    State: H complex channels stored as S = 2H reals.
    """

    family = "affine"
    pointwise_precompute = True
    fast_scan = True
    fused = "diagonal-aussm"

    def __init__(self, d_in: int, hidden: int, nonlinearity: str | None = None, **_: object):
        super().__init__(d_in, hidden, 2 * hidden, hidden, nonlinearity)
        self.W_theta = nn.Linear(d_in, hidden)
        with torch.no_grad():
            self.W_theta.bias.uniform_(-math.pi, math.pi)
        self.W_dt = nn.Linear(d_in, hidden)
        self.W_x = nn.Linear(d_in, hidden)
        self.B = nn.Parameter(torch.randn(hidden, 2) / math.sqrt(2))
        self.C = nn.Parameter(torch.randn(hidden, 2) / math.sqrt(2))
        self.D = nn.Parameter(torch.ones(hidden))

    def precompute(self, u: torch.Tensor) -> Terms:
        theta = self.W_theta(u)  # [B, T, H]
        sx = F.silu(self.W_x(u))  # [B, T, H]
        dt = F.softplus(self.W_dt(u))  # [B, T, H]
        drive = (dt * sx)[..., None] * self.B  # [B, T, H, 2]
        return {"cos": torch.cos(theta), "sin": torch.sin(theta), "drive": drive.flatten(-2), "sx": sx}

    def transition(self, h: torch.Tensor, p: Terms) -> torch.Tensor:
        hc = h.unflatten(-1, (self.hidden, 2))  # [B, H, 2]
        return apply_phi(self.phi, _rotate(hc, p["cos"], p["sin"]).flatten(-2) + p["drive"])

    def scan(self, h0: torch.Tensor, p: Terms) -> torch.Tensor:
        """Complex chunked scan when phi is the identity; the generic loop otherwise."""
        if not self.fast_scan_ok():
            return super().scan(h0, p)
        return _rotation_scan(h0, p)

    def readout(self, hs: torch.Tensor, p: Terms) -> torch.Tensor:
        h_re, h_im = hs.unflatten(-1, (self.hidden, 2)).unbind(-1)  # [B, T, H] each
        c_re, c_im = self.C.unbind(-1)
        return h_re * c_re - h_im * c_im + self.D * p["sx"]

    def diagonal_tables(self, p: Terms, params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Tables of the fused kernel (complex form) from the terms ``p`` over the vocabulary
        and the parameters ``params``: a = e^{iθ}, b = Δ·B·silu(x) ``[V, H]`` complex,
        C ``[V, H]`` complex (the same for every token), g = 1 and e = D·silu(x) ``[V, H]``,
        so that Re(C·h) + e is :meth:`readout`."""
        a = torch.complex(p["cos"], p["sin"])
        b = torch.view_as_complex(p["drive"].unflatten(-1, (-1, 2)).contiguous())
        C = torch.complex(params["C"][:, 0], params["C"][:, 1]).expand_as(a)
        return a, b, C, torch.ones_like(p["sx"]), params["D"] * p["sx"]


class Mamba3Cell(Cell):
    """mamba3: complex diagonal with data-dependent rotation and decay.

    Δ_t = softplus(W_Δ x̃_t + b_Δ), A_t = −max(softplus(W_A x̃_t + b_A), 1e−4),
    θ_t = Δ_t·(W_θ x̃_t) (rotary angles from the input), x_t = W_x x̃_t,
    B_t, C_t ∈ ℂ^H from the input,
    h_t = exp(Δ_t A_t)·e^{iθ_t} ⊙ h_{t−1} + Δ_t·x_t·B_t,
    y_t = (Re(C_t ⊙ h_t) + D·x_t)·silu(z_t).
    The transition is a rotation times a decay: affine in h.  Interpretation note: the
    trapezoidal mixing of Mamba-3 is replaced by this Euler (zero-order-hold) step; it
    does not change the family or the form of the Jacobian.
    """

    family = "affine"
    pointwise_precompute = True
    fast_scan = True
    fused = "diagonal-mamba3"

    def __init__(self, d_in: int, hidden: int, nonlinearity: str | None = None, **_: object):
        super().__init__(d_in, hidden, 2 * hidden, hidden, nonlinearity)
        self.W_dt = nn.Linear(d_in, hidden)
        self.W_A = nn.Linear(d_in, hidden)
        self.W_theta = nn.Linear(d_in, hidden)
        self.W_x = nn.Linear(d_in, hidden)
        self.W_z = nn.Linear(d_in, hidden)
        self.W_B = nn.Linear(d_in, 2 * hidden)
        self.W_C = nn.Linear(d_in, 2 * hidden)
        self.D = nn.Parameter(torch.ones(hidden))
        nn.init.constant_(self.W_dt.bias, 0.5)
        nn.init.constant_(self.W_A.bias, -4.0)

    def precompute(self, u: torch.Tensor) -> Terms:
        dt = F.softplus(self.W_dt(u))  # [B, T, H]
        a = -F.softplus(self.W_A(u)).clamp_min(1e-4)  # [B, T, H]
        decay = torch.exp(dt * a)
        theta = dt * self.W_theta(u)
        x = self.W_x(u)
        b_t = self.W_B(u).unflatten(-1, (self.hidden, 2))  # [B, T, H, 2]
        drive = (dt * x)[..., None] * b_t
        return {
            "cos": decay * torch.cos(theta),
            "sin": decay * torch.sin(theta),
            "drive": drive.flatten(-2),
            "x": x,
            "z": self.W_z(u),
            "C": self.W_C(u).unflatten(-1, (self.hidden, 2)),
        }

    def transition(self, h: torch.Tensor, p: Terms) -> torch.Tensor:
        hc = h.unflatten(-1, (self.hidden, 2))
        return apply_phi(self.phi, _rotate(hc, p["cos"], p["sin"]).flatten(-2) + p["drive"])

    def scan(self, h0: torch.Tensor, p: Terms) -> torch.Tensor:
        """Complex chunked scan when phi is the identity; the generic loop otherwise."""
        if not self.fast_scan_ok():
            return super().scan(h0, p)
        return _rotation_scan(h0, p)

    def readout(self, hs: torch.Tensor, p: Terms) -> torch.Tensor:
        h_re, h_im = hs.unflatten(-1, (self.hidden, 2)).unbind(-1)  # [B, T, H] each
        c_re, c_im = p["C"].unbind(-1)
        return (h_re * c_re - h_im * c_im + self.D * p["x"]) * F.silu(p["z"])

    def diagonal_tables(self, p: Terms, params: dict[str, torch.Tensor]) -> tuple[torch.Tensor, ...]:
        """Tables of the fused kernel (complex form) from the terms ``p`` over the vocabulary
        and the parameters ``params``: a = exp(Δ·A)·e^{iθ}, b = Δ·x·B, C ``[V, H]`` complex,
        g = silu(z) and e = D·x·silu(z) ``[V, H]``, so that g·Re(C·h) + e is :meth:`readout`."""
        a = torch.complex(p["cos"], p["sin"])
        b = torch.view_as_complex(p["drive"].unflatten(-1, (-1, 2)).contiguous())
        C = torch.view_as_complex(p["C"].contiguous())
        gate = F.silu(p["z"])
        return a, b, C, gate, params["D"] * p["x"] * gate
