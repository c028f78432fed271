"""A hand-built S3 tracker whose Jacobians, return maps and fixed points are known in closed
form (tests/analysis/test_jacobian.py, tests/analysis/test_fixed_points.py)."""

from __future__ import annotations

import itertools

import numpy as np
import torch
from torch import nn

# S3 as permutations of (0, 1, 2); product (a·b)(i) = a(b(i)); label g_t = x_t · g_{t-1}
PERMS = list(itertools.permutations(range(3)))
MUL = np.array([[PERMS.index(tuple(a[b[i]] for i in range(3))) for b in PERMS] for a in PERMS])
INV = np.array([PERMS.index(tuple(np.argsort(p))) for p in PERMS])
E = PERMS.index((0, 1, 2))


def regular_rep() -> torch.Tensor:
    """L[x] e_g = e_{x·g}: ``[6, 6, 6]`` permutation matrices of the left regular representation."""
    mats = torch.zeros(6, 6, 6, dtype=torch.float64)
    for x in range(6):
        for g in range(6):
            mats[x, MUL[x, g], g] = 1.0
    return mats


class S3Tracker(nn.Module):
    """Hand-built S3 tracker implementing the model protocol.

    State = [layer 0: 3 token-driven dims that never feed the tracker | layer 1: Q [v; w]],
    v in R^6 the regular-representation state (one-hot of the group element when exact),
    w in R^2 extra dims decaying by ``mu``.  Per step u = L_x v, then
    - 'affine': v' = u;
    - 'smooth': v' = phi(u) coordinatewise, phi(u) = lam u + (1 - lam)(3u^2 - 2u^3), so
      phi(0) = 0, phi(1) = 1, phi'(0) = phi'(1) = lam: the Jacobian at a vertex is lam·L_x;
    - 'pull': v' = c + lam P_U (u - c) + nu P_1 (u - c), c = nearest vertex of u,
      P_1 = 11^T/6, P_U = I - P_1: contraction lam along U and nu along the all-ones direction.
    """

    def __init__(self, kind: str, lam: float = 0.6, nu: float = 0.8, mu: float = 0.5, seed: int = 0):
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        q, _ = torch.linalg.qr(torch.randn(8, 8, generator=gen, dtype=torch.float64))
        self.kind, self.lam, self.nu, self.mu = kind, lam, nu, mu
        self.register_buffer("L", regular_rep())
        self.register_buffer("Q", q)
        self.register_buffer("emb", torch.randn(6, 3, generator=gen, dtype=torch.float64))
        self.state_size, self.n_classes = 11, 6

    def layer_slice(self, layer: int) -> slice:
        return [slice(0, 3), slice(3, 11)][layer]

    def init_state(self, batch: int) -> torch.Tensor:
        core = torch.zeros(batch, 8, dtype=self.Q.dtype)
        core[:, E] = 1.0
        return torch.cat([torch.zeros(batch, 3, dtype=self.Q.dtype), core @ self.Q.T], dim=1)

    def step(self, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        pre, z = state[:, :3], state[:, 3:]
        core = z @ self.Q  # [B, 8] = [v, w]
        v, w = core[:, :6], core[:, 6:]
        u = torch.einsum("bij,bj->bi", self.L[tokens], v)  # [B, 6]
        if self.kind == "affine":
            v_new = u
        elif self.kind == "smooth":
            v_new = self.lam * u + (1 - self.lam) * (3 * u**2 - 2 * u**3)
        else:
            c = (u == u.max(dim=-1, keepdim=True).values).to(u.dtype)  # nearest vertex
            d = u - c
            mean = d.mean(dim=-1, keepdim=True)
            v_new = c + self.lam * (d - mean) + self.nu * mean
        new_core = torch.cat([v_new, self.mu * w], dim=1)
        new_state = torch.cat([0.9 * pre + self.emb[tokens], new_core @ self.Q.T], dim=1)
        return v_new, new_state

    def forward(self, tokens, state=None, return_states=False):
        h = self.init_state(tokens.shape[0]) if state is None else state
        logits, states = [], []
        for i in range(tokens.shape[1]):
            lg, h = self.step(h, tokens[:, i])
            logits.append(lg)
            states.append(h)
        return torch.stack(logits, 1), h, torch.stack(states, 1) if return_states else None


def s3_batch(n: int, t: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 6, size=(n, t))
    labels = np.zeros((n, t), dtype=np.int64)
    g = np.full(n, E)
    for i in range(t):
        g = MUL[tokens[:, i], g]
        labels[:, i] = g
    return torch.from_numpy(tokens), labels
