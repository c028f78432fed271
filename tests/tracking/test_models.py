"""The model zoo: step == forward, declared == measured family, analytic Jacobians."""

import pytest
import torch
from torch.func import jacrev

from dynlab.tracking.models import (
    BUILTIN_ARCHS,
    NONLINEARITIES,
    Cell,
    Tracker,
    available_cells,
    get_cell,
    measure_family,
    probe_jacobian_variation,
    register_cell,
)
from dynlab.tracking.models.nonlinearity import apply_phi

EXPECTED_FAMILY = {
    "mamba": "affine",
    "negative-mamba": "affine",
    "mamba3": "affine",
    "aussm": "affine",
    "linear-rnn": "affine",
    "token-gated-rnn": "affine",
    "tanh-rnn": "state-dependent",
    "state-gated-rnn": "state-dependent",
}


def test_builtin_zoo_is_complete():
    assert set(EXPECTED_FAMILY) == set(BUILTIN_ARCHS)


def _tracker(arch, layers=2, **kw):
    torch.manual_seed(0)
    return Tracker(arch, 6, 6, hidden=8, layers=layers, **kw).double()


@pytest.mark.parametrize("arch", BUILTIN_ARCHS)
def test_step_and_forward_agree(arch):
    m = _tracker(arch)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 6, (5, 13), generator=gen)
    h0 = torch.randn(5, m.state_size, generator=gen, dtype=torch.float64)
    out = m(tokens, h0, return_states=True)
    h = h0
    for t in range(13):
        logits, h = m.step(h, tokens[:, t])
        torch.testing.assert_close(logits, out.logits[:, t], rtol=1e-10, atol=1e-10)
        torch.testing.assert_close(h, out.states[:, t], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(h, out.final_state, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("arch", BUILTIN_ARCHS)
def test_split_and_carry_equals_whole(arch):
    m = _tracker(arch)
    tokens = torch.randint(0, 6, (3, 20), generator=torch.Generator().manual_seed(2))
    whole = m(tokens)
    first = m(tokens[:, :7])
    rest = m(tokens[:, 7:], first.final_state)
    torch.testing.assert_close(torch.cat([first.logits, rest.logits], 1), whole.logits, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(rest.final_state, whole.final_state, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("arch", BUILTIN_ARCHS)
def test_probe_measures_the_declared_family(arch):
    cell = _tracker(arch, layers=1).cells[0]
    assert cell.declared_family == EXPECTED_FAMILY[arch]
    assert measure_family(cell) == EXPECTED_FAMILY[arch]


@pytest.mark.parametrize("arch", ["linear-rnn", "mamba", "aussm"])
@pytest.mark.parametrize("phi", ["tanh", "relu", "maxmin", "groupsort", "layernorm", "sphere"])
def test_nonlinearity_makes_affine_cells_state_dependent(arch, phi):
    cell = _tracker(arch, layers=1, nonlinearity=phi).cells[0]
    assert cell.declared_family == "state-dependent"
    assert measure_family(cell) == "state-dependent"


def test_linear_rnn_jacobian_is_its_matrix():
    cell = _tracker("linear-rnn", layers=1).cells[0]
    u = torch.randn(1, cell.d_in, dtype=torch.float64)
    for _ in range(3):
        h = torch.randn(1, cell.state_size, dtype=torch.float64)
        jac = jacrev(lambda s: cell.step(s, u)[1])(h)[0, :, 0, :]
        torch.testing.assert_close(jac, cell.A.detach(), rtol=0, atol=1e-12)


def test_tanh_rnn_jacobian_matches_closed_form():
    cell = _tracker("tanh-rnn", layers=1).cells[0]
    u = torch.randn(1, cell.d_in, dtype=torch.float64)
    h = torch.randn(1, cell.state_size, dtype=torch.float64)
    pre = h @ cell.A.T + cell.B(u)
    expected = torch.diag((1 - torch.tanh(pre) ** 2)[0]) @ cell.A
    jac = jacrev(lambda s: cell.step(s, u)[1])(h)[0, :, 0, :]
    torch.testing.assert_close(jac, expected.detach(), rtol=1e-10, atol=1e-12)


def test_mamba_jacobian_is_diagonal_decay():
    cell = _tracker("mamba", layers=1).cells[0]
    u = torch.randn(1, cell.d_in, dtype=torch.float64)
    h = torch.randn(1, cell.state_size, dtype=torch.float64)
    jac = jacrev(lambda s: cell.step(s, u)[1])(h)[0, :, 0, :]
    dt = torch.nn.functional.softplus(cell.W_dt(u))[0]  # [H]
    decay = torch.exp(dt[:, None] * -torch.exp(cell.a_log)).flatten()
    torch.testing.assert_close(jac, torch.diag(decay).detach(), rtol=1e-10, atol=1e-12)


def test_aussm_transition_is_unitary():
    cell = _tracker("aussm", layers=1).cells[0]
    u = torch.randn(4, cell.d_in, dtype=torch.float64)
    h1, h2 = torch.randn(2, 4, cell.state_size, dtype=torch.float64)
    d1 = cell.step(h1, u)[1] - cell.step(h2, u)[1]
    torch.testing.assert_close(d1.norm(dim=-1), (h1 - h2).norm(dim=-1), rtol=1e-10, atol=1e-12)


def test_negative_mamba_eigenvalues_can_be_negative():
    cell = _tracker("negative-mamba", layers=1).cells[0]
    with torch.no_grad():
        cell.W_dt.bias.fill_(5.0)  # large Δ: exp(Δa) → 0, so 2·exp(Δa) − 1 → −1
    u = torch.randn(1, cell.d_in, dtype=torch.float64)
    p = cell.precompute(u[:, None])
    assert (p["decay"] < 0).any() and (p["decay"] > -1).all()


def test_nonlinearities_against_hand_computation():
    h = torch.tensor([[3.0, -1.0, 0.5, 2.0, -4.0, 1.0, 0.0, 7.0]], dtype=torch.float64)
    assert apply_phi("maxmin", h).tolist() == [[3.0, -1.0, 2.0, 0.5, 1.0, -4.0, 7.0, 0.0]]
    assert apply_phi("groupsort", h).tolist() == [[3.0, 2.0, 0.5, -1.0, 7.0, 1.0, 0.0, -4.0]]
    torch.testing.assert_close(apply_phi("sphere", h).norm(), torch.tensor(8.0**0.5, dtype=torch.float64))
    ln = apply_phi("layernorm", h)
    torch.testing.assert_close(ln.mean(), torch.tensor(0.0, dtype=torch.float64), atol=1e-12, rtol=0)
    assert set(NONLINEARITIES) >= {"tanh", "relu", "maxmin", "groupsort", "layernorm", "sphere"}


def test_user_cells_of_each_family_are_measured():
    @register_cell("test-user-affine")
    class UserAffine(Cell):
        family = "affine"

        def __init__(self, d_in, hidden, nonlinearity=None, **kw):
            super().__init__(d_in, hidden, hidden, hidden, nonlinearity)
            self.A = torch.nn.Linear(hidden, hidden, bias=False)
            self.B = torch.nn.Linear(d_in, hidden)

        def precompute(self, u):
            return {"drive": self.B(u), "gate": torch.sigmoid(self.B(u))}

        def transition(self, h, p):
            return p["gate"] * self.A(h) + p["drive"]

    @register_cell("test-user-gru")
    class UserGRU(Cell):
        family = "state-dependent"

        def __init__(self, d_in, hidden, nonlinearity=None, **kw):
            super().__init__(d_in, hidden, hidden, hidden, nonlinearity)
            self.gru = torch.nn.GRUCell(d_in, hidden)

        def precompute(self, u):
            return {"u": u}

        def transition(self, h, p):
            return self.gru(p["u"], h)

    assert "test-user-affine" in available_cells() and get_cell("test-user-gru") is UserGRU
    for name, fam in (("test-user-affine", "affine"), ("test-user-gru", "state-dependent")):
        m = Tracker(name, 4, 4, hidden=6)
        assert measure_family(m.cells[0]) == fam
        # forward/step agreement holds for user cells through the generic loop
        tokens = torch.randint(0, 4, (2, 5))
        out = m(tokens)
        h = m.init_state(2)
        for t in range(5):
            _, h = m.step(h, tokens[:, t])
        torch.testing.assert_close(h, out.final_state)
    assert probe_jacobian_variation(Tracker("test-user-affine", 4, 4, hidden=6).cells[0]) < 1e-12


def test_registry_refuses_unknown_and_bad_cells():
    with pytest.raises(ValueError, match="allowed: .*tanh-rnn"):
        get_cell("lstm9000")
    with pytest.raises(TypeError):
        register_cell("x")(object)  # type: ignore[arg-type]

    class BadFamily(Cell):
        family = "chaotic"

    with pytest.raises(ValueError, match="allowed: affine, state-dependent"):
        register_cell("bad")(BadFamily)


def test_bad_nonlinearity_and_layer_are_refused():
    with pytest.raises(ValueError, match="allowed"):
        Tracker("tanh-rnn", 4, 4, hidden=8, nonlinearity="softsign")
    with pytest.raises(ValueError, match="even state size"):
        Tracker("tanh-rnn", 4, 4, hidden=7, nonlinearity="maxmin")
    with pytest.raises(ValueError, match="out of range"):
        Tracker("tanh-rnn", 4, 4, hidden=8).layer_slice(3)
