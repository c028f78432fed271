"""Step / return-map Jacobians and Lyapunov exponents on hand-built trackers with known answers."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch
from torch import nn

from dynlab.analysis.geometry import class_centroids, symbolic_basis
from dynlab.analysis.jacobian import (
    analysis_copy,
    lyapunov_exponents,
    return_map_jacobian,
    return_map_on_U,
    step_jacobians,
    trajectory_jacobians,
)

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


def words() -> list[list[int]]:
    rng = np.random.default_rng(11)
    prefix = rng.integers(0, 6, size=5)
    closing = E  # product of the prefix, closed by its inverse
    for x in prefix:
        closing = MUL[x, closing]
    transposition = PERMS.index((1, 0, 2))
    three_cycle = PERMS.index((1, 2, 0))
    return [
        [transposition, transposition],
        [three_cycle] * 3,
        [3, int(INV[3])],
        [*prefix.tolist(), int(INV[closing])],
    ]


def centroids_and_basis(model: S3Tracker) -> tuple[np.ndarray, np.ndarray]:
    tokens, labels = s3_batch(240, 7, seed=1)
    _, _, states = model(tokens, return_states=True)
    full = states[:, -1].detach().numpy()  # [N, S]
    cent, counts = class_centroids(full, labels[:, -1], 6)
    assert (counts > 0).all()
    basis = symbolic_basis(cent[:, model.layer_slice(-1)])
    return cent, basis


def test_words_are_state_preserving():
    for w in words():
        g = E
        for x in w:
            g = MUL[x, g]
        assert g == E
    assert MUL[1, 2] != MUL[2, 1] or MUL[2, 3] != MUL[3, 2]  # non-commutative convention


def test_affine_return_map_is_identity_on_U():
    model = S3Tracker("affine")
    cent, basis = centroids_and_basis(model)
    assert basis.shape == (8, 5)
    ds = return_map_on_U(model, words(), cent, basis)
    np.testing.assert_allclose(ds["return_map_eig"].values, 1.0, atol=1e-10)
    np.testing.assert_allclose(ds["return_map_eig_imag"].values, 0.0, atol=1e-10)
    np.testing.assert_allclose(ds["DF_U"].values, np.broadcast_to(np.eye(5), ds["DF_U"].shape), atol=1e-10)
    assert ds["word_length"].values.tolist() == [len(w) for w in words()]
    # the full Jacobian is not the identity: the extra dims decay by mu per step
    full = return_map_jacobian(model, words()[0], cent[:1])
    assert torch.linalg.matrix_norm(full[0] - torch.eye(11, dtype=torch.float64)) > 0.5


def test_smooth_contracting_return_map_eigenvalues():
    lam = 0.7
    model = S3Tracker("smooth", lam=lam)
    cent, basis = centroids_and_basis(model)
    ds = return_map_on_U(model, words(), cent, basis)
    for i, w in enumerate(words()):
        np.testing.assert_allclose(ds["return_map_eig"].values[i], lam ** len(w), atol=1e-10)


def tanh_rnn(s: int, seed: int) -> nn.Module:
    class TanhRNN(nn.Module):
        def __init__(self):
            super().__init__()
            gen = torch.Generator().manual_seed(seed)
            self.A = nn.Parameter(torch.randn(s, s, generator=gen) / s**0.5)
            self.emb = nn.Parameter(torch.randn(4, s, generator=gen))
            self.state_size, self.n_classes = s, 4

        def layer_slice(self, layer):
            return slice(0, s)

        def init_state(self, batch):
            return torch.zeros(batch, s, dtype=self.A.dtype)

        def step(self, state, tokens):
            h = torch.tanh(state @ self.A.T + self.emb[tokens])
            return h[:, :4], h

    return TanhRNN()


def test_batched_step_jacobians_match_loop_and_formula():
    model = tanh_rnn(9, seed=3)
    gen = torch.Generator().manual_seed(4)
    states = torch.randn(17, 9, generator=gen, dtype=torch.float64)
    tokens = torch.randint(0, 4, (17,), generator=gen)
    jac = step_jacobians(model, states, tokens)
    m64 = analysis_copy(model)
    for b in range(17):
        loop = torch.autograd.functional.jacobian(lambda h: m64.step(h[None], tokens[b : b + 1])[1][0], states[b])
        torch.testing.assert_close(jac[b], loop, rtol=1e-12, atol=1e-12)
    a = model.A.detach().double()
    h_new = torch.tanh(states @ a.T + model.emb.detach().double()[tokens])
    formula = (1 - h_new**2)[:, :, None] * a[None]  # diag(1 - h'^2) A
    torch.testing.assert_close(jac, formula, rtol=1e-12, atol=1e-12)
    assert model.A.dtype == torch.float32 and model.A.requires_grad  # caller's model untouched


def test_trajectory_jacobians_along_run():
    model = tanh_rnn(5, seed=5)
    tokens = torch.randint(0, 4, (3, 6), generator=torch.Generator().manual_seed(6))
    jac = trajectory_jacobians(model, tokens)
    assert jac.shape == (3, 6, 5, 5)
    a, emb = model.A.detach().double(), model.emb.detach().double()
    h = torch.zeros(3, 5, dtype=torch.float64)
    for i in range(6):
        h = torch.tanh(h @ a.T + emb[tokens[:, i]])
        torch.testing.assert_close(jac[:, i], (1 - h**2)[:, :, None] * a[None], rtol=1e-12, atol=1e-12)


class LinearMap(nn.Module):
    def __init__(self, a: torch.Tensor):
        super().__init__()
        self.register_buffer("A", a)
        self.state_size, self.n_classes = a.shape[0], 1

    def layer_slice(self, layer):
        return slice(0, self.state_size)

    def init_state(self, batch):
        return torch.ones(batch, self.state_size, dtype=self.A.dtype)

    def step(self, state, tokens):
        h = state @ self.A.T
        return h[:, :1], h


@pytest.mark.slow
def test_lyapunov_of_linear_map():
    gen = torch.Generator().manual_seed(7)
    eig = torch.tensor([1.1, -0.9, 0.5, 0.3, -0.1], dtype=torch.float64)
    v, _ = torch.linalg.qr(torch.randn(5, 5, generator=gen, dtype=torch.float64))
    a = v @ torch.diag(eig) @ v.T  # symmetric (normal): exponents = log |eigenvalues|
    ds = lyapunov_exponents(LinearMap(a), torch.zeros(4, 400, dtype=torch.long), k=3, generator=gen)
    expect = np.sort(np.log(np.abs(eig.numpy())))[::-1][:3]
    np.testing.assert_allclose(ds["lyap"].values, np.broadcast_to(expect, (4, 3)), atol=0.02)
    assert ds["lyap"].attrs["units"] == "1/token"


@pytest.mark.slow
def test_lyapunov_of_exact_affine_tracker():
    model = S3Tracker("affine", mu=0.5)
    tokens, _ = s3_batch(3, 300, seed=8)
    ds = lyapunov_exponents(model, tokens)  # k = S = 11
    # spectrum: 6 neutral permutation directions, 3 at log 0.9 (layer 0), 2 at log 0.5 (extra)
    expect = np.array([0.0] * 6 + [np.log(0.9)] * 3 + [np.log(0.5)] * 2)
    # with k = S the sum is exactly the mean log |det J| per step
    np.testing.assert_allclose(ds["lyap"].values.sum(1), expect.sum(), atol=1e-10)
    np.testing.assert_allclose(ds["lyap_mean"].values, expect, atol=0.02)  # finite-T bias ~ 1/T


def test_bad_input_raises():
    model = tanh_rnn(4, seed=0)
    with pytest.raises(ValueError, match="allowed"):
        step_jacobians(model, torch.zeros(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="basis"):
        return_map_on_U(model, [[0, 1]], torch.zeros(2, 4), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="k="):
        lyapunov_exponents(model, torch.zeros(2, 3, dtype=torch.long), k=9)
