"""An exact permutation tracker registered as a user cell (``test-exact-perm``)."""

from __future__ import annotations

import torch

from dynlab.tracking.groups import get_group
from dynlab.tracking.models import Cell, Tracker, register_cell


def permutation_matrices(group) -> torch.Tensor:
    """[G, G, G]: P[x] is the left-multiplication matrix of element x on one-hot states."""
    n = group.order
    p = torch.zeros(n, n, n, dtype=torch.float64)
    for x in range(n):
        for g in range(n):
            p[x, group.table[x, g], g] = 1.0
    return p


@register_cell("test-exact-perm")
class ExactPermutationCell(Cell):
    """h_t = P(x_t) h_{t-1} on one-hot group states: an exact affine tracker.

    The layer input must be a one-hot token embedding of size |G|; the transition picks
    the permutation matrix by the embedding (a linear map of u), so J = P(x) does not
    depend on h.  The initial state is the identity element's one-hot vector.
    """

    family = "affine"

    def __init__(self, d_in: int, hidden: int, nonlinearity=None, **_):
        super().__init__(d_in, hidden, hidden, hidden, nonlinearity)
        self.register_buffer("P", torch.zeros(d_in, hidden, hidden))

    def init_state(self, batch, device=None, dtype=None):
        h = torch.zeros(batch, self.state_size, device=device, dtype=dtype or self.P.dtype)
        h[:, 0] = 1.0
        return h

    def precompute(self, u):  # u [B, T, G] one-hot
        return {"P": torch.einsum("btx,xij->btij", u, self.P)}

    def transition(self, h, p):
        return torch.einsum("bij,bj->bi", p["P"], h)


def exact_tracker(group_name: str) -> Tracker:
    """A Tracker whose single cell tracks the group exactly; readout = identity logits."""
    g = get_group(group_name)
    n = g.order
    m = Tracker("test-exact-perm", n, n, hidden=n, d_embed=n).double()
    with torch.no_grad():
        m.embed.weight.copy_(torch.eye(n))
        m.cells[0].P.copy_(permutation_matrices(g))
        m.readout.weight.copy_(torch.eye(n))
        m.readout.bias.zero_()
    # the Tracker's zero initial state is replaced by the identity one-hot
    m.init_state = lambda batch, device=None, dtype=None: m.cells[0].init_state(batch, device, dtype)  # type: ignore[method-assign]
    return m
