"""A language model as a one-token recurrence on a flat state, and its dynamics: the
step Jacobian (whole state, or a layer's own block), its spectrum split along and across
the symbolic subspace U (ρ, ρ∥, ρ⊥), and the fixed points of one step under a filler token.

:class:`LMRecurrence` speaks the cell protocol of :mod:`dynlab.analysis.jacobian` and
:mod:`dynlab.analysis.fixed_points.finder` (``step(state [B, S], tokens [B]) -> (logits [B, V],
state [B, S])``), so their Jacobians, spectra and fixed-point finder apply unchanged.  A
diagonal SSM layer's own-state Jacobian (Mamba's and GLA's per-channel decays) is found
from three reverse passes (:func:`layer_jacobian_diagonal`) and its spectrum from its
diagonal (:func:`dynlab.analysis.fixed_points.finder.diagonal_spectrum`); anything else takes the
dense Jacobian.  :mod:`dynlab.lm.analysis.state_geometry` calls these on the task models' probe states.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import numpy as np
import torch
from torch import nn

from dynlab.analysis.fixed_points.finder import diagonal_spectrum, find_fixed_points, spectrum, word_map
from dynlab.analysis.jacobian import analysis_copy, step_jacobians
from dynlab.lm.models.states import CarriedStates

__all__ = ["FP_MAX_STATE", "LMRecurrence", "embedded_basis", "filler_fixed_points", "flat_states", "layer_jacobian_diagonal",
           "layer_jacobians", "recurrence_spectra", "state_jacobians"]

#: The largest flat state whose filler fixed points are searched (the solver's dense
#: Levenberg–Marquardt steps cost O(S³)); larger models get NaN fixed-point rows.
FP_MAX_STATE = 2048


class LMRecurrence(nn.Module):
    """The per-token recurrence of a :class:`~dynlab.lm.models.model.RecurrentLM` on a flat state.

    Flat layout: every layer's SSM state ``[H, P, N]`` flattened, in layer order, then every
    layer's convolution window ``[C, K - 1]`` (layers without one add nothing).
    """

    def __init__(self, lm: nn.Module) -> None:
        super().__init__()
        self.lm = lm
        self.ssm_shapes = [tuple(s) for s in lm.state_shapes()]
        self.conv_shapes = [None if c is None else tuple(c) for c in lm.conv_shapes()]
        sizes = [math.prod(s) for s in self.ssm_shapes] + [math.prod(c) for c in self.conv_shapes if c is not None]
        self.offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(int).tolist()
        self.state_size = int(self.offsets[-1])
        self.n_classes = 256

    def layer_slice(self, layer: int) -> slice:
        """The flat positions of layer ``layer``'s SSM state (negative: from the last)."""
        i = layer % len(self.ssm_shapes)
        return slice(self.offsets[i], self.offsets[i + 1])

    def init_state(self, batch: int) -> torch.Tensor:
        p = next(self.lm.parameters())
        return torch.zeros(batch, self.state_size, device=p.device, dtype=p.dtype)

    def unflatten(self, h: torch.Tensor) -> CarriedStates:
        # one torch.split, not a slice per part: its backward is one cat, where each slice's
        # backward fills and adds a whole [.., S] gradient (under jacrev, S of them per part)
        parts = list(torch.split(h, np.diff(self.offsets).tolist(), dim=1))
        n = len(self.ssm_shapes)
        ssm = [parts[i].reshape(-1, *s) for i, s in enumerate(self.ssm_shapes)]
        conv, j = [], n
        for c in self.conv_shapes:
            if c is None:
                conv.append(None)
                continue
            conv.append(parts[j].reshape(-1, *c))
            j += 1
        return CarriedStates(ssm, conv)

    @staticmethod
    def flatten(states: CarriedStates) -> torch.Tensor:
        parts = [s.reshape(s.shape[0], -1) for s in states]
        parts += [w.reshape(w.shape[0], -1) for w in getattr(states, "conv", []) if w is not None]
        return torch.cat(parts, dim=1)

    def step(self, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        logits, new = self.lm(tokens.reshape(-1, 1), self.unflatten(state))
        return logits[:, -1], self.flatten(new)


def embedded_basis(rec: LMRecurrence, states: np.ndarray, labels: np.ndarray, n_classes: int, layer: int) -> np.ndarray:
    """Orthonormal basis of U (from the class centroids of ``states [N, s]`` of ``layer``) in the flat state."""
    from dynlab.analysis.centroids import class_centroids
    from dynlab.analysis.geometry import symbolic_basis

    cent, _ = class_centroids(states, labels, n_classes)
    b = symbolic_basis(cent)
    full = np.zeros((rec.state_size, b.shape[1]))
    full[rec.layer_slice(layer)] = b
    return full


@torch.no_grad()
def flat_states(rec: LMRecurrence, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(flat state before the last token ``[B, S]``, last token ``[B]``) of ``tokens [B, L]``."""
    _, states = rec.lm(tokens[:, :-1], None)
    return rec.flatten(states), tokens[:, -1]


def state_jacobians(rec: LMRecurrence, h: torch.Tensor, x: torch.Tensor) -> np.ndarray:
    """``[B, S, S]`` step Jacobians: ``torch.func`` (jacrev under vmap) where the mixer's
    operators can be batched (Mamba-2, GLA), else one reverse-mode Jacobian per sample (the
    selective-scan kernel is a custom autograd function with no vmap rule)."""
    try:
        return step_jacobians(rec, h, x).numpy()
    except RuntimeError:
        def one(i: int) -> np.ndarray:
            fn = lambda s: rec.step(s.unsqueeze(0), x[i:i + 1])[1].squeeze(0)  # noqa: E731
            return torch.autograd.functional.jacobian(fn, h[i]).numpy()
        return np.stack([one(i) for i in range(h.shape[0])])


def _own_state_step(rec: LMRecurrence, base: torch.Tensor, x: torch.Tensor, sl: slice) -> Callable[[torch.Tensor], torch.Tensor]:
    """``v -> h^L_t`` of the tracked layer (slice ``sl`` of the flat state): one step from ``base
    [S]`` with that layer's state replaced by ``v``, on the token ``x [1]``."""
    def f(v: torch.Tensor) -> torch.Tensor:
        full = torch.cat([base[:sl.start], v, base[sl.stop:]])
        return rec.step(full.unsqueeze(0), x)[1][0, sl]

    return f


def layer_jacobians(rec: LMRecurrence, h: torch.Tensor, x: torch.Tensor, layer: int = -1) -> np.ndarray:
    """``[B, s, s]``: the block ∂h^L_t/∂h^L_{t-1} of the step Jacobian for layer ``layer``'s
    SSM state (the other layers' states and the windows held at ``h [B, S]``; tokens
    ``x [B]``): the tracked layer's own recurrence, as paper A analyses its tracked layer."""
    sl = rec.layer_slice(layer)
    out = []
    for i in range(h.shape[0]):
        base = h[i].detach()
        f = _own_state_step(rec, base, x[i:i + 1], sl)

        try:
            jac = torch.func.jacrev(f)(base[sl])
        except RuntimeError:  # kernels without a vmap rule (the selective scan)
            jac = torch.autograd.functional.jacobian(f, base[sl])
        out.append(jac.detach().cpu().numpy())
    return np.stack(out)


def layer_jacobian_diagonal(rec: LMRecurrence, h: torch.Tensor, x: torch.Tensor, layer: int = -1,
                            rtol: float = 1e-10) -> np.ndarray | None:
    """``d [B, s]`` when the block of :func:`layer_jacobians` is diagonal at every sample, else
    None.  d = Jᵀ·1 by one reverse pass; the block is taken as diagonal when Jᵀ·r equals
    d ⊙ r for two random Gaussian r (to ``rtol`` in float64) — a non-diagonal J passes that
    with probability zero.  A diagonal SSM's own-state step
    (Mamba's and GLA's per-channel decays) is diagonal, so two products replace the s
    reverse passes of the dense Jacobian."""
    sl = rec.layer_slice(layer)
    gen = torch.Generator().manual_seed(0)
    out = []
    for i in range(h.shape[0]):
        base = h[i].detach()
        f = _own_state_step(rec, base, x[i:i + 1], sl)

        v0 = base[sl].clone().requires_grad_(True)
        with torch.enable_grad():
            y = f(v0)
            r = [torch.ones_like(y)] + [torch.randn(y.shape, generator=gen, dtype=y.dtype) for _ in range(2)]
            # one reverse pass per product (the first-order backward every kernel has, the one
            # the dense path uses); a diagonal J equals its transpose
            jr = [torch.autograd.grad(y, v0, ri, retain_graph=True)[0] for ri in r]
        d = jr[0]
        if not all(torch.allclose(j, d * ri, rtol=rtol, atol=rtol * float(d.abs().max())) for j, ri in zip(jr[1:], r[1:])):
            return None
        out.append(d.detach().cpu().numpy())
    return np.stack(out)


def recurrence_spectra(model: nn.Module, tokens: torch.Tensor, labels: np.ndarray, n_classes: int,
                       *, layer: int = -1, n_jac: int = 4) -> dict[str, float]:
    """The tracked layer's step Jacobian (:func:`layer_jacobians`, float64, torch.func) at the
    last step of ``n_jac`` of the trajectories ``tokens [B, L]``, split along and across U
    of that layer (U from the class centroids of all B states, ``labels [B]``): median of
    ρ, ρ∥ = ρ(Bᵀ J B) and ρ⊥ (J on U⊥) over them (:func:`dynlab.analysis.fixed_points.finder.spectrum`)."""
    from dynlab.analysis.centroids import class_centroids
    from dynlab.analysis.geometry import symbolic_basis

    rec = LMRecurrence(analysis_copy(model)).double()
    h_prev, x = flat_states(rec, tokens.to(next(rec.parameters()).device))
    with torch.no_grad():
        _, h = rec.step(h_prev, x)
    cent, _ = class_centroids(h[:, rec.layer_slice(layer)].numpy(), labels, n_classes)
    basis = symbolic_basis(cent)
    diag = layer_jacobian_diagonal(rec, h_prev[:n_jac], x[:n_jac], layer)
    if diag is not None:  # the same numbers as the dense path, from two products per sample
        sp = [diagonal_spectrum(d, basis) for d in diag]
    else:
        sp = [spectrum(j, basis) for j in layer_jacobians(rec, h_prev[:n_jac], x[:n_jac], layer)]
    return {k: float(np.nanmedian([s[k] for s in sp])) for k in ("rho", "rho_par", "rho_perp")}


def filler_fixed_points(model: nn.Module, tokens: torch.Tensor, labels: np.ndarray, n_classes: int,
                        *, filler: int = ord(" "), layer: int = -1, n_starts: int = 4) -> dict[str, float]:
    """Fixed points of one step under the filler token ``filler`` (whole LM, float64),
    solved from ``n_starts`` of the states after ``tokens [B, L]``: count, largest residual,
    ρ∥ and ρ⊥ (U of ``layer``) at the first one found (NaN when none)."""
    rec = LMRecurrence(analysis_copy(model)).double()
    with torch.no_grad():
        _, states = rec.lm(tokens.to(next(rec.parameters()).device), None)
    h = rec.flatten(states)
    basis = embedded_basis(rec, h[:, rec.layer_slice(layer)].numpy(), labels, n_classes, layer)
    fp = find_fixed_points(word_map(rec, [filler]), h[:n_starts].numpy(), basis=basis, iterate=200)
    found = fp.points.shape[0] > 0
    return {"fp_count": float(fp.points.shape[0]),
            "fp_residual": float(fp.residuals.max()) if found else float(fp.best_residual),
            "fp_rho_par": float(fp.rho_par[0]) if found else float("nan"),
            "fp_rho_perp": float(fp.rho_perp[0]) if found else float("nan")}

