"""State nonlinearities phi of the recurrent cells, h_t = phi(g ⊙ (A h_{t-1}) + B x̃_t + b).

Pointwise (tanh, relu) and pairwise (maxmin, groupsort) maps have Jacobians that depend
on the state; layernorm and sphere normalise the state (their Jacobians depend on the
state too, but on the symbolic subspace they act like rescalings; docs/choices.md, "The recurrent cells").  The
identity keeps an affine cell affine.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from dynlab.errors import DynlabInputError
from dynlab.names import NONLINEARITIES

__all__ = ["NONLINEARITIES", "apply_phi", "check_phi"]

_GROUPSORT_SIZE = 4


def check_phi(name: str, state_size: int) -> str:
    if name not in NONLINEARITIES:
        raise DynlabInputError(f"unknown nonlinearity {name!r}; allowed: {', '.join(NONLINEARITIES)}")
    if name == "maxmin" and state_size % 2:
        raise DynlabInputError(f"nonlinearity 'maxmin' needs an even state size, got {state_size}")
    if name == "groupsort" and state_size % _GROUPSORT_SIZE:
        raise DynlabInputError(f"nonlinearity 'groupsort' needs a state size divisible by {_GROUPSORT_SIZE}, got {state_size}")
    return name


def apply_phi(name: str, h: torch.Tensor) -> torch.Tensor:
    """Apply phi along the last dimension of ``h [..., S]``."""
    if name == "identity":
        return h
    if name == "tanh":
        return torch.tanh(h)
    if name == "relu":
        return F.relu(h)
    if name == "maxmin":
        pairs = h.unflatten(-1, (-1, 2))  # [..., S/2, 2]
        return torch.stack([pairs.amax(-1), pairs.amin(-1)], dim=-1).flatten(-2)
    if name == "groupsort":
        groups = h.unflatten(-1, (-1, _GROUPSORT_SIZE))  # [..., S/4, 4]
        return groups.sort(dim=-1, descending=True).values.flatten(-2)
    if name == "layernorm":
        return F.layer_norm(h, h.shape[-1:])
    if name == "sphere":
        # Project on the sphere of radius sqrt(S) so entries stay O(1).
        return h * (h.shape[-1] ** 0.5) / h.norm(dim=-1, keepdim=True).clamp_min(1e-12)
    raise DynlabInputError(f"unknown nonlinearity {name!r}; allowed: {', '.join(NONLINEARITIES)}")
