"""Step / return-map Jacobians and Lyapunov exponents on hand-built trackers with known answers."""

from __future__ import annotations

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

from helpers.s3 import E, INV, MUL, PERMS, S3Tracker, s3_batch


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
    np.testing.assert_allclose(ds["return_map_eig"].values, 1.0, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(ds["return_map_eig_imag"].values, 0.0, rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(ds["DF_U"].values, np.broadcast_to(np.eye(5), ds["DF_U"].shape), rtol=1e-7, atol=1e-10)
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
        np.testing.assert_allclose(ds["return_map_eig"].values[i], lam ** len(w), rtol=1e-7, atol=1e-10)


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
    np.testing.assert_allclose(ds["lyap"].values, np.broadcast_to(expect, (4, 3)), rtol=1e-7, atol=0.02)
    assert ds["lyap"].attrs["units"] == "1/token"


@pytest.mark.slow
def test_lyapunov_of_exact_affine_tracker():
    model = S3Tracker("affine", mu=0.5)
    tokens, _ = s3_batch(3, 300, seed=8)
    ds = lyapunov_exponents(model, tokens)  # k = S = 11
    # spectrum: 6 neutral permutation directions, 3 at log 0.9 (layer 0), 2 at log 0.5 (extra)
    expect = np.array([0.0] * 6 + [np.log(0.9)] * 3 + [np.log(0.5)] * 2)
    # with k = S the sum is exactly the mean log |det J| per step
    np.testing.assert_allclose(ds["lyap"].values.sum(1), expect.sum(), rtol=1e-7, atol=1e-10)
    np.testing.assert_allclose(ds["lyap_mean"].values, expect, rtol=1e-7, atol=0.02)  # finite-T bias ~ 1/T


def test_bad_input_raises():
    model = tanh_rnn(4, seed=0)
    with pytest.raises(ValueError, match="allowed"):
        step_jacobians(model, torch.zeros(3, 5), torch.zeros(3, dtype=torch.long))
    with pytest.raises(ValueError, match="basis"):
        return_map_on_U(model, [[0, 1]], torch.zeros(2, 4), np.zeros((3, 2)))
    with pytest.raises(ValueError, match="k="):
        lyapunov_exponents(model, torch.zeros(2, 3, dtype=torch.long), k=9)


@pytest.mark.parametrize("window_numbers", [1, 3 * 4 * 5 * 5, 10**9])  # one step, 4 steps (T = 10 is no multiple), all
def test_lyapunov_windows_equal_the_step_by_step_qr(monkeypatch, window_numbers):
    """The exponents found from windows of step Jacobians (one vmap call per window) are the
    QR method run step by step on :func:`trajectory_jacobians` of a state-dependent RNN, whatever
    the window."""
    import dynlab.analysis.jacobian as jacobian

    monkeypatch.setattr(jacobian, "_JAC_WINDOW_NUMBERS", window_numbers)
    model = tanh_rnn(5, seed=5)
    tokens = torch.randint(0, 4, (3, 10), generator=torch.Generator().manual_seed(6))
    ds = lyapunov_exponents(model, tokens, k=2, generator=torch.Generator().manual_seed(2))
    jac = trajectory_jacobians(model, tokens)  # [B, T, S, S]
    q0, _ = torch.linalg.qr(torch.randn(5, 2, generator=torch.Generator().manual_seed(2), dtype=torch.float64))
    q, logs = q0.expand(3, 5, 2), torch.zeros(3, 2, dtype=torch.float64)
    for i in range(10):
        q, r = torch.linalg.qr(jac[:, i] @ q)
        logs += torch.log(torch.diagonal(r, dim1=-2, dim2=-1).abs())
    expect = -np.sort(-(logs / 10).numpy(), axis=-1)
    np.testing.assert_allclose(ds["lyap"].values, expect, rtol=1e-12, atol=1e-14)
