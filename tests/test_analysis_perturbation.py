"""Perturbation injection along U / U-perp on hand-built S3 trackers with analytic rates."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from dynlab.analysis.perturbation import perturbation_response

# S3 as permutations of (0, 1, 2); product (a·b)(i) = a(b(i)); label g_t = x_t · g_{t-1}
PERMS = list(itertools.permutations(range(3)))
MUL = np.array([[PERMS.index(tuple(a[b[i]] for i in range(3))) for b in PERMS] for a in PERMS])
E = PERMS.index((0, 1, 2))


class PullTracker(nn.Module):
    """Two-layer hand-built S3 tracker (model protocol).

    Layer 0 (3 dims): z' = 0.9 z + emb[x], never read by layer 1.  Layer 1 (6 dims): the
    left-regular-representation state v; per step u = L_x v, c = nearest vertex of u, and
    v' = c + lam P_U (u - c) + nu P_1 (u - c) (P_1 = 11^T/6, P_U = I - P_1 is the projector on
    U = span{e_g - e_g'}).  Near a vertex a perturbation along U shrinks by lam per step and
    one along U-perp (the all-ones direction) by nu; 'smooth' replaces the pull by the
    coordinatewise phi(u) = lam u + (1 - lam)(3u^2 - 2u^3) with phi'(vertex) = lam.
    """

    def __init__(self, lam: float, nu: float, kind: str = "pull"):
        super().__init__()
        mats = torch.zeros(6, 6, 6, dtype=torch.float64)
        for x in range(6):
            for g in range(6):
                mats[x, MUL[x, g], g] = 1.0
        self.register_buffer("L", mats)
        self.register_buffer("emb", torch.randn(6, 3, generator=torch.Generator().manual_seed(0), dtype=torch.float64))
        self.lam, self.nu, self.kind = lam, nu, kind
        self.state_size, self.n_classes = 9, 6

    def layer_slice(self, layer: int) -> slice:
        return [slice(0, 3), slice(3, 9)][layer]

    def init_state(self, batch: int) -> torch.Tensor:
        h = torch.zeros(batch, 9, dtype=self.L.dtype)
        h[:, 3 + E] = 1.0
        return h

    def step(self, state, tokens):
        z, v = state[:, :3], state[:, 3:]
        u = torch.einsum("bij,bj->bi", self.L[tokens], v)
        if self.kind == "smooth":
            v_new = self.lam * u + (1 - self.lam) * (3 * u**2 - 2 * u**3)
        else:
            c = (u == u.max(dim=-1, keepdim=True).values).to(u.dtype)
            d = u - c
            mean = d.mean(dim=-1, keepdim=True)
            v_new = c + self.lam * (d - mean) + self.nu * mean
        return v_new, torch.cat([0.9 * z + self.emb[tokens], v_new], dim=1)


def s3_batch(n: int, t: int, seed: int) -> tuple[torch.Tensor, np.ndarray]:
    rng = np.random.default_rng(seed)
    tokens = rng.integers(0, 6, size=(n, t))
    labels = np.zeros((n, t), dtype=np.int64)
    g = np.full(n, E)
    for i in range(t):
        g = MUL[tokens[:, i], g]
        labels[:, i] = g
    return torch.from_numpy(tokens), labels


def test_pull_tracker_recovery_rates_are_analytic():
    lam, nu = 0.6, 0.8
    tokens, labels = s3_batch(120, 20, seed=1)
    ds = perturbation_response(
        PullTracker(lam, nu), tokens, labels, t0=5, eps=0.05, rng=np.random.default_rng(2)
    )
    assert int(ds["k_U"]) == 5
    np.testing.assert_allclose(float(ds["M_t0"]), np.sqrt(2), rtol=1e-12)  # vertices e_g
    np.testing.assert_allclose(ds["delta_norm"].sel(t=5).values, 0.05 * np.sqrt(2), rtol=1e-12)
    steps = ds["t"].values - 5
    expect = 0.05 * np.sqrt(2) * np.stack([lam**steps, nu**steps])  # exact: linear near vertices
    np.testing.assert_allclose(ds["delta_norm"].values, expect, rtol=1e-9)
    np.testing.assert_allclose(ds["recovery_rate"].values, [np.log(lam), np.log(nu)], rtol=1e-8)
    # the clean run sits on the vertices, so the perturbed distance is the perturbation itself
    np.testing.assert_allclose(ds["dist_clean"].values, 0.0, atol=1e-12)
    np.testing.assert_allclose(ds["dist_pert"].values, expect, rtol=1e-9)
    np.testing.assert_allclose(ds["q_clean"].values, 0.0, atol=1e-12)
    assert list(ds["direction"].values) == ["U", "U_perp"]
    assert ds["recovery_rate"].attrs["units"] == "1/token"


def test_smooth_tracker_rate_and_neutral_affine():
    tokens, labels = s3_batch(120, 15, seed=3)
    lam = 0.7
    smooth = perturbation_response(
        PullTracker(lam, lam, kind="smooth"), tokens, labels, t0=4, eps=1e-4, rng=np.random.default_rng(4)
    )
    np.testing.assert_allclose(smooth["recovery_rate"].values, np.log(lam), atol=1e-3)
    # lam = nu = 1: the pull is the identity map near vertices, an exact affine tracker
    neutral = perturbation_response(PullTracker(1.0, 1.0), tokens, labels, t0=4, eps=0.1)
    np.testing.assert_allclose(neutral["recovery_rate"].values, 0.0, atol=1e-12)
    np.testing.assert_allclose(neutral["delta_norm"].values, 0.1 * np.sqrt(2), rtol=1e-12)
    # q of the perturbed population: R (own centroids) <= RMS |delta| = eps*M, so 0 < q <~ eps
    q = neutral["q_pert"].values
    assert (q > 0.05).all() and (q < 0.1 * 1.05).all()


def test_perturbation_only_touches_tracked_layer():
    class Spy(PullTracker):
        """Records the first stacked [clean; U; U_perp] state handed to ``step``."""

        seen: list[torch.Tensor] = []

        def step(self, state, tokens):
            if state.shape[0] == 3 * 60 and not self.seen:
                self.seen.append(state.clone())
            return super().step(state, tokens)

    tokens, labels = s3_batch(60, 10, seed=5)
    eps = 0.1
    ds = perturbation_response(Spy(0.6, 0.8), tokens, labels, t0=3, eps=eps)
    (stacked,) = Spy.seen
    clean, par, perp = stacked.reshape(3, 60, 9)
    torch.testing.assert_close(par[:, :3], clean[:, :3], rtol=0, atol=0)  # layer 0 untouched
    torch.testing.assert_close(perp[:, :3], clean[:, :3], rtol=0, atol=0)
    d_par, d_perp = (par - clean)[:, 3:], (perp - clean)[:, 3:]
    size = eps * float(ds["M_t0"])
    torch.testing.assert_close(d_par.norm(dim=1), torch.full((60,), size, dtype=torch.float64))
    torch.testing.assert_close(d_par.sum(dim=1), torch.zeros(60, dtype=torch.float64))  # in U (sum zero)
    ones = torch.full((6,), size / 6**0.5, dtype=torch.float64)
    torch.testing.assert_close(d_perp.abs(), ones.expand(60, 6))  # U_perp = all-ones direction


def test_bad_input_raises():
    tokens, labels = s3_batch(10, 5, seed=6)
    model = PullTracker(0.6, 0.8)
    with pytest.raises(ValueError, match="t0"):
        perturbation_response(model, tokens, labels, t0=9)
    with pytest.raises(ValueError, match="eps"):
        perturbation_response(model, tokens, labels, t0=2, eps=0.0)
    with pytest.raises(ValueError, match="labels"):
        perturbation_response(model, tokens, labels[:, :3], t0=2)
