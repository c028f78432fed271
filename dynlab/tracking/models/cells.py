"""Recurrent cells of the unified recurrence (paper A; their equations and sources in docs/choices.md).

Every cell maps a layer input ``u [B, T, D]`` and an initial state ``h0 [B, S]`` to
outputs ``y [B, T, O]`` and states ``hs [B, T, S]``.  A cell is written as three pieces:

- :meth:`Cell.precompute` — every term that depends on the input only, for the whole
  sequence at once (``dict`` of ``[B, T, …]`` tensors);
- :meth:`Cell.transition` — one step ``h_{t-1} -> h_t`` given the step's precomputed terms;
- :meth:`Cell.readout` — the layer output from the states (and precomputed terms).

``forward`` runs the loop (or a fast scan where the cell provides one) and ``step`` runs
one step; a test checks they agree.  Complex diagonal states (AUSSM, Mamba-3) are stored
as real ``[…, 2]`` (real, imaginary) pairs so every analysis sees a real vector.

Return order, the one convention of the whole code base: **outputs first, state
second** (as ``torch.nn.RNN``'s ``(output, h_n)`` and Mamba's ``(out, last_state)``).
``Cell.forward`` returns ``(y [B, T, O], hs [B, T, S])``, ``Cell.step`` ``(y [B, O],
h [B, S])``, :meth:`dynlab.tracking.models.Tracker.step` ``(logits [B, C], state [B, S])``,
``Tracker.forward`` a :class:`~dynlab.tracking.models.TrackerOutput` (logits, final state, …), the
scan kernels ``(y, final_state)`` and the LM mixers and models ``(y, state)``.

Kernels a cell runs on are declared by two class attributes, never inferred:

- ``fast_scan`` (bool): :meth:`Cell.scan` runs a dedicated kernel instead of the per-step
  loop over :meth:`Cell.transition` (:mod:`dynlab.kernels.scan.chunked`): the dense RNNs with
  phi ∈ {identity, tanh} a reverse-time hand-written backward, the diagonal affine cells
  with phi = identity a chunked scan.  Every other case runs the generic loop,
  ``Cell.scan``, which is also the reference the fast scans are tested against.
- ``fused`` (``"dense"``, ``"token-gated"``, ``"state-gated"``, ``"diagonal"`` or None):
  the fused training kernel (:mod:`dynlab.kernels.tracker_loss.dense`,
  :mod:`dynlab.kernels.tracker_loss.gated`, :mod:`dynlab.kernels.tracker_loss.diagonal`) that
  computes exactly this cell's loss in a one-layer tracker; :meth:`Cell.fused_kind` adds
  the checks on the instance (phi, parameters).  The studies train the architectures
  whose cell class declares one as stacked ensembles (the dense kernels: one batched GEMM
  per step for all members; the diagonal kernel: one member after another on the CPU).

A subclass that overrides any method (``precompute``, ``transition``, ``readout``,
``scan``, ``step``, ``forward``, ``__init__``, a private helper, …) loses both — ``fused``
becomes None and ``fast_scan`` False — unless its own class body declares them again
(:meth:`Cell.__init_subclass__`): a cell that changes the recurrence can never be trained
by a kernel that computes the old one.  Re-declare them only when the override keeps the
computation the kernel implements.

To add a cell: subclass :class:`Cell`, set ``family`` (``"affine"`` if ∂h_t/∂h_{t-1}
does not depend on h_{t-1}, else ``"state-dependent"``), implement the three methods and
decorate with :func:`dynlab.tracking.models.register_cell`.  The family probe
(:func:`dynlab.tracking.models.measure_family`) then checks the declaration.
"""

from __future__ import annotations

import inspect
import math
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.kernels.dispatch import linear_scan  # Triton on CUDA, the chunked torch scan on the CPU
from dynlab.kernels.scan.chunked import dense_rnn_scan
from dynlab.kernels.tracker_loss.common import PHIS as FUSED_PHIS
from dynlab.tracking.models.nonlinearity import apply_phi, check_phi

__all__ = [
    "AUSSMCell",
    "Cell",
    "FUSED_KERNELS",
    "FUSED_KERNEL_PHIS",
    "LinearRNNCell",
    "Mamba3Cell",
    "MambaCell",
    "NegativeMambaCell",
    "StateGatedRNNCell",
    "TanhRNNCell",
    "TokenGatedRNNCell",
    "overridden_methods",
]

Terms = dict[str, torch.Tensor]

#: The fused training kernels a cell class may declare in :attr:`Cell.fused`, each with the
#: parameters (names as in the cell's ``named_parameters()``) it reads, and nothing else.
#: Dense kernels: the recurrence ``A [S, S]``, the drive ``B`` and gate input ``W_g``
#: (``nn.Linear`` with bias, applied to the token embedding) and the state-to-gate matrix
#: ``U_g [S, S]``.  ``"diagonal"``, ``"diagonal-mamba3"``, ``"diagonal-aussm"``
#: (:mod:`dynlab.kernels.tracker_loss.diagonal`): the parameters of :class:`MambaCell`,
#: :class:`Mamba3Cell`, :class:`AUSSMCell`; the kernel reads the tables the cell's own
#: ``diagonal_tables`` forms from its :meth:`Cell.precompute` over the vocabulary (so a
#: subclass may change the decay, as negative-mamba does) and computes the cell's readout.
FUSED_KERNELS: dict[str, tuple[str, ...]] = {
    "dense": ("A", "B.weight", "B.bias"),
    "token-gated": ("A", "B.weight", "B.bias", "W_g.weight", "W_g.bias"),
    "state-gated": ("A", "B.weight", "B.bias", "W_g.weight", "W_g.bias", "U_g"),
    "diagonal": ("W_x.weight", "W_x.bias", "W_z.weight", "W_z.bias", "W_dt.weight", "W_dt.bias",
                 "W_B.weight", "W_C.weight", "a_log", "D"),
    "diagonal-mamba3": ("W_dt.weight", "W_dt.bias", "W_A.weight", "W_A.bias", "W_theta.weight", "W_theta.bias",
                        "W_x.weight", "W_x.bias", "W_z.weight", "W_z.bias", "W_B.weight", "W_B.bias",
                        "W_C.weight", "W_C.bias", "D"),
    "diagonal-aussm": ("W_theta.weight", "W_theta.bias", "W_dt.weight", "W_dt.bias", "W_x.weight", "W_x.bias",
                       "B", "C", "D"),
}

#: The nonlinearities phi each fused kernel implements (the diagonal scan is linear).
FUSED_KERNEL_PHIS: dict[str, tuple[str, ...]] = {
    "dense": FUSED_PHIS, "token-gated": FUSED_PHIS, "state-gated": FUSED_PHIS,
    "diagonal": ("identity",), "diagonal-mamba3": ("identity",), "diagonal-aussm": ("identity",),
}

#: Kernel attributes of a cell class and the value a subclass that overrides a method gets
#: unless it declares the attribute again (:meth:`Cell.__init_subclass__`).
_KERNEL_ATTRS: dict[str, object] = {"fused": None, "fast_scan": False}


def overridden_methods(cls: type) -> list[str]:
    """Names of the methods (functions, static/class methods, properties) that ``cls``
    defines in its own class body and one of its bases also defines (``__init__``
    included): the overrides that may change what an inherited kernel computes."""
    own = [
        name for name, value in vars(cls).items()
        if inspect.isfunction(value) or isinstance(value, (staticmethod, classmethod, property))
    ]
    return [name for name in own if name != "__init_subclass__" and any(hasattr(b, name) for b in cls.__mro__[1:])]


class Cell(nn.Module):
    """Base class of a recurrent cell.

    Class attributes:
        family: declared family with the default nonlinearity, ``"affine"`` or
            ``"state-dependent"``.  With a non-identity ``phi`` every cell is
            state-dependent (:attr:`declared_family`).
        default_phi: nonlinearity used when none is given.
        fast_scan: :meth:`scan` runs a dedicated kernel (for the nonlinearities
            :meth:`fast_scan_ok` accepts); lost by a subclass that overrides a method.
        fused: name of the fused training kernel (a key of :data:`FUSED_KERNELS`) that
            computes this cell in a one-layer tracker, or None; lost by a subclass that
            overrides a method.
    """

    family: ClassVar[str] = "state-dependent"
    default_phi: ClassVar[str] = "identity"
    fast_scan: ClassVar[bool] = False
    fused: ClassVar[str | None] = None
    #: True when :meth:`precompute` acts on every time step separately (term t depends on
    #: u_t only).  Trainers may then precompute the terms once per vocabulary entry and
    #: gather them by token (:func:`dynlab.tracking.train.engine.tracker_logits`).  The built-in
    #: cells set it; a subclass whose precompute mixes time steps must set it False.
    pointwise_precompute: ClassVar[bool] = False

    def __init_subclass__(cls, **kwargs: object) -> None:
        """A subclass that overrides any method loses the kernel attributes ``fused`` and
        ``fast_scan`` it would inherit (None and False) unless its class body declares them
        again; a ``fused`` value outside :data:`FUSED_KERNELS` is an error."""
        super().__init_subclass__(**kwargs)
        if overridden_methods(cls):
            for attr, lost in _KERNEL_ATTRS.items():
                if attr not in vars(cls):
                    setattr(cls, attr, lost)
        if cls.fused is not None and cls.fused not in FUSED_KERNELS:
            raise ValueError(f"{cls.__name__}.fused = {cls.fused!r}; allowed: None, {', '.join(FUSED_KERNELS)}")

    def __init__(self, d_in: int, hidden: int, state_size: int, out_size: int, nonlinearity: str | None = None):
        super().__init__()
        if d_in < 1 or hidden < 1:
            raise ValueError(f"d_in and hidden must be ≥ 1, got d_in={d_in}, hidden={hidden}")
        self.d_in = d_in
        self.hidden = hidden
        self.state_size = state_size
        self.out_size = out_size
        self.phi = check_phi(nonlinearity or self.default_phi, state_size)

    @property
    def declared_family(self) -> str:
        if self.family == "affine" and self.phi != "identity":
            return "state-dependent"
        return self.family

    # -- the three pieces ---------------------------------------------------------
    def precompute(self, u: torch.Tensor) -> Terms:  # u [B, T, D]
        raise NotImplementedError

    def transition(self, h: torch.Tensor, p: Terms) -> torch.Tensor:  # h [B, S], p[k] [B, …]
        raise NotImplementedError

    def readout(self, hs: torch.Tensor, p: Terms) -> torch.Tensor:  # hs [B, T, S] -> [B, T, O]
        return hs

    # -- public API ---------------------------------------------------------------
    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        """Zero state ``[B, S]``."""
        return torch.zeros(batch, self.state_size, device=device, dtype=dtype)

    def fast_scan_ok(self) -> bool:
        """True when :meth:`scan` runs a dedicated kernel rather than the per-step loop over
        :meth:`transition` (so a compiled transition would not be used there): the class
        declares ``fast_scan`` and phi is the identity (the diagonal scans are linear)."""
        return type(self).fast_scan and self.phi == "identity"

    def fused_kind(self) -> str | None:
        """The fused training kernel that computes exactly this cell, or None: the class
        declares ``fused``, phi is one the kernel implements (:data:`FUSED_KERNEL_PHIS`:
        identity and tanh, identity only for ``"diagonal"``), and the parameters are
        exactly those the kernel reads (:data:`FUSED_KERNELS`), its linear layers plain
        ``nn.Linear``.  The tracker around the cell
        has its own conditions (:meth:`dynlab.tracking.models.Tracker.fused_kind`)."""
        kind = type(self).fused
        if kind is None or self.phi not in FUSED_KERNEL_PHIS[kind]:
            return None
        if {name for name, _ in self.named_parameters()} != set(FUSED_KERNELS[kind]):
            return None
        layers = {name.split(".")[0] for name in FUSED_KERNELS[kind] if "." in name}
        if any(type(getattr(self, layer)) is not nn.Linear for layer in layers):
            return None
        return kind

    def scan(self, h0: torch.Tensor, p: Terms) -> torch.Tensor:
        """All states ``[B, T, S]`` from ``h0 [B, S]``; a plain loop over time.

        ``unbind`` (not ``x[:, t]``) keeps the backward pass O(T): the gradient of each
        slice is stacked once instead of zero-filling the whole input per step.
        """
        steps = {k: v.unbind(1) for k, v in p.items()}
        n_steps = len(next(iter(steps.values())))
        h = h0
        out = []
        for t in range(n_steps):
            h = self.transition(h, {k: v[t] for k, v in steps.items()})
            out.append(h)
        return torch.stack(out, dim=1)

    def forward(self, u: torch.Tensor, h0: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """Run ``u [B, T, D]`` from ``h0 [B, S]`` (zero if None).

        Returns ``(y [B, T, O], hs [B, T, S])``; ``hs[:, -1]`` is the final state.
        """
        if h0 is None:
            h0 = self.init_state(u.shape[0], u.device, u.dtype)
        p = self.precompute(u)
        hs = self.scan(h0, p)
        return self.readout(hs, p), hs

    def step(self, h: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``h [B, S]``, ``u [B, D]`` → ``(y [B, O], h_new [B, S])`` (output first,
        as :meth:`forward`)."""
        p = self.precompute(u[:, None])
        h_new = self.transition(h, {k: v[:, 0] for k, v in p.items()})
        return self.readout(h_new[:, None], p)[:, 0], h_new


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
