"""The cell protocol of the unified recurrence (paper A): the :class:`Cell` base class, the
fused training kernels a cell may declare, and the rule that an override loses them.  The
built-in cells are in :mod:`dynlab.tracking.models.cells`.

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
from typing import ClassVar

import torch
from torch import nn

from dynlab.kernels.tracker_loss.common import PHIS as FUSED_PHIS
from dynlab.tracking.models.nonlinearity import check_phi

__all__ = ["Cell", "FUSED_KERNELS", "FUSED_KERNEL_PHIS", "Terms", "overridden_methods"]

#: A cell's precomputed terms (:meth:`Cell.precompute`), by name.
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
