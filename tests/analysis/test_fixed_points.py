"""Fixed points, slow points and their spectra (dynlab.analysis.fixed_points, dynlab.analysis.fixed_points.slow_points) on maps whose
answers are known in closed form (or from a scalar root found independently)."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.optimize
import torch

from dynlab.analysis.fixed_points.solve import (
    NEWTON_ACCEPT, deduplicate, initial_points, jacobians, keep_converged, newton_all, numpy_map, orbit_starts, solve,
)
from dynlab.analysis.fixed_points.finder import affine_fixed_set, cell_map, find_fixed_points, spectrum, word_map
from dynlab.analysis.fixed_points.slow_points import find_slow_points
from dynlab.tracking.models import Cell, Tracker, register_cell


def _sorted_eig(e: np.ndarray) -> np.ndarray:
    return np.sort_complex(np.asarray(e, dtype=np.complex128))


# -- an affine map: fixed point and spectrum in closed form ---------------------------------


def _affine(seed: int = 0):
    rng = np.random.default_rng(seed)
    v = rng.standard_normal((3, 3))
    lam = np.array([1.2, 0.5, -0.3])
    a = v @ np.diag(lam) @ np.linalg.inv(v)
    b = rng.standard_normal(3)
    at, bt = torch.as_tensor(a), torch.as_tensor(b)
    return a, b, lam, (lambda h: at @ h + bt)


def test_affine_map_fixed_point_and_spectrum_in_closed_form():
    a, b, lam, fn = _affine()
    fp = find_fixed_points(fn, np.random.default_rng(1).standard_normal((5, 3)))
    assert fp.affine and fp.count == 1.0 and fp.found
    np.testing.assert_allclose(fp.points[0], np.linalg.solve(np.eye(3) - a, b), rtol=1e-12, atol=1e-12)
    assert fp.residuals[0] < 1e-12
    np.testing.assert_allclose(_sorted_eig(fp.eig[0]), _sorted_eig(lam), rtol=1e-7, atol=1e-12)
    assert fp.rho[0] == pytest.approx(1.2, rel=0, abs=1e-12)
    assert not fp.stable[0]
    assert fp.fixed_dim[0] == 0


def test_batched_jacobians_are_the_analytic_ones_and_those_point_by_point():
    """An affine map's DF is A at every point; a tanh map's DF is diag(1 − tanh²(W h + c)) W,
    and the batched call gives what ``numpy_map``'s df gives one point at a time."""
    a, _, _, fn = _affine(2)
    pts = np.random.default_rng(4).standard_normal((6, 3))
    np.testing.assert_allclose(jacobians(fn, pts), np.broadcast_to(a, (6, 3, 3)), rtol=1e-13, atol=1e-13)
    rng = np.random.default_rng(5)
    w, c = rng.standard_normal((4, 4)), rng.standard_normal(4)
    wt, ct = torch.as_tensor(w), torch.as_tensor(c)
    pts = rng.standard_normal((5, 4))
    got = jacobians(lambda h: torch.tanh(wt @ h + ct), pts)
    want = np.stack([np.diag(1 - np.tanh(w @ h + c) ** 2) @ w for h in pts])
    np.testing.assert_allclose(got, want, rtol=1e-12, atol=1e-12)
    _, df = numpy_map(lambda h: torch.tanh(wt @ h + ct))
    np.testing.assert_allclose(got, np.stack([df(h) for h in pts]), rtol=1e-14, atol=1e-14)


def test_affine_map_through_the_nonlinear_path_agrees():
    """The LM/Newton solve (affine detection off) lands on the closed-form fixed point."""
    a, b, lam, fn = _affine(3)
    sol = solve(fn, np.zeros((2, 3)))
    np.testing.assert_allclose(sol.points[0], np.linalg.solve(np.eye(3) - a, b), rtol=1e-7, atol=1e-12)
    assert keep_converged(sol).points.shape[0] == 2


def test_rho_on_U_and_U_perp_are_the_compressions():
    """DF = [[0.5, 2], [0, 0.9]] with U = e1: ρ∥ = 0.5 (Bᵀ DF B), ρ⊥ = 0.9, ρ = 0.9."""
    sp = spectrum(np.array([[0.5, 2.0], [0.0, 0.9]]), np.array([[1.0], [0.0]]))
    assert sp["rho_par"] == pytest.approx(0.5)
    assert sp["rho_perp"] == pytest.approx(0.9)
    assert sp["rho"] == pytest.approx(0.9)
    assert sp["stable"]


def test_affine_fixed_subspace_reports_its_dimension():
    """A = diag(1, 0.5), b = (0, 1): the fixed set is the line y = 2 (dimension 1)."""
    at, bt = torch.tensor([[1.0, 0.0], [0.0, 0.5]], dtype=torch.float64), torch.tensor([0.0, 1.0], dtype=torch.float64)
    fp = find_fixed_points(lambda h: at @ h + bt, np.array([[3.0, 0.0], [5.0, 1.0]]))
    assert fp.affine and np.isnan(fp.count)
    assert fp.fixed_dim[0] == 1
    np.testing.assert_allclose(fp.points[0], [4.0, 2.0], rtol=1e-7, atol=1e-12)  # nearest the mean start (4, 0.5)
    assert fp.rho[0] == pytest.approx(1.0) and not fp.stable[0]


def test_affine_map_without_fixed_point_reports_none():
    """A translation h -> h + c has no fixed point; neither has diag(1, 0.5) with b = (1, 1)."""
    c = torch.tensor([0.3, -0.4], dtype=torch.float64)
    fp = find_fixed_points(lambda h: h + c, np.zeros((3, 2)))
    assert fp.affine and fp.count == 0 and not fp.found
    assert fp.best_residual == pytest.approx(0.5)
    assert affine_fixed_set(np.diag([1.0, 0.5]), np.array([1.0, 1.0])) is None


# -- a hand-built tanh flip-flop with known attractors ----------------------------------------------

W_FF = 2.0
H_STAR = scipy.optimize.brentq(lambda x: np.tanh(W_FF * x) - x, 0.5, 1.0)  # h* = tanh(2 h*), ≈ 0.9575


@register_cell("test-flip-flop")
class FlipFlopCell(Cell):
    """h' = tanh(2 h + 4 u): each unit a bistable bit; u = +1 / -1 pulses set / reset it and
    u = 0 holds it (fixed points ±h*, stable, DF = 2(1 − h*²); 0, unstable, DF = 2)."""

    family = "state-dependent"

    def __init__(self, d_in: int, hidden: int, nonlinearity=None, **_):
        super().__init__(d_in, hidden, hidden, hidden, nonlinearity)
        self.inp = torch.nn.Linear(d_in, hidden, bias=False)

    def precompute(self, u):
        return {"drive": 4.0 * self.inp(u)}

    def transition(self, h, p):
        return torch.tanh(W_FF * h + p["drive"])


def _flip_flop_tracker() -> Tracker:
    """2 bits; tokens 0 = hold, 1/2 = set/reset bit 0, 3/4 = set/reset bit 1 (float64)."""
    tr = Tracker("test-flip-flop", n_tokens=5, n_classes=4, hidden=2, d_embed=2).double()
    with torch.no_grad():
        tr.cells[0].inp.weight.copy_(torch.eye(2))
        tr.embed.weight.copy_(torch.tensor([[0, 0], [1, 0], [-1, 0], [0, 1], [0, -1]], dtype=torch.float64))
    return tr


def test_flip_flop_attractors_from_visited_states():
    tr = _flip_flop_tracker()
    corners = []
    with torch.no_grad():  # visit the four corners: set/reset each bit, then hold
        for seq in ([1, 3, 0], [1, 4, 0], [2, 3, 0], [2, 4, 0]):
            h = torch.zeros(1, 2, dtype=torch.float64)
            for x in seq:
                _, h = tr.step(h, torch.tensor([x]))
            corners.append(h[0].numpy())
    states = np.asarray(corners)
    fp = find_fixed_points(word_map(tr, [0]), initial_points(states, noise=0.05, rng=np.random.default_rng(0)))
    assert not fp.affine and fp.count == 4
    np.testing.assert_allclose(np.sort(np.abs(fp.points), axis=None), np.full(8, H_STAR), rtol=1e-7, atol=1e-12)
    assert set(map(tuple, np.sign(fp.points).astype(int))) == {(1, 1), (1, -1), (-1, 1), (-1, -1)}
    lam = W_FF * (1 - H_STAR**2)  # ≈ 0.1663
    np.testing.assert_allclose(fp.eig.real, lam, rtol=1e-7, atol=1e-10)
    assert fp.stable.all() and (fp.residuals < 1e-12).all()


def test_flip_flop_all_nine_fixed_points_from_a_grid_of_a_bare_registered_cell():
    """From a grid, the hold map of the bare cell (cell_map) has 3² fixed points: 4 stable
    corners, 4 saddles (one bit at 0: eigenvalues 2 and 2(1 − h*²)) and the source at 0."""
    tr = _flip_flop_tracker()
    grid = np.array([[x, y] for x in (-0.9, -0.05, 0.05, 0.9) for y in (-0.9, -0.05, 0.05, 0.9)])
    fp = find_fixed_points(cell_map(tr.cells[0], torch.zeros(2, dtype=torch.float64)), grid)
    assert fp.count == 9
    lam = W_FF * (1 - H_STAR**2)
    for p, e, stable in zip(fp.points, fp.eig, fp.stable):
        zero = np.abs(p) < 1e-12
        np.testing.assert_allclose(np.abs(p[~zero]), H_STAR, rtol=1e-7, atol=1e-12)
        want = np.where(zero, W_FF, lam)
        np.testing.assert_allclose(np.sort(e.real), np.sort(want), rtol=1e-7, atol=1e-10)
        assert stable == (not zero.any())


# -- a 2-D system with a saddle and two nodes -------------------------------------------------------


def test_saddle_and_nodes_of_a_2d_map():
    """Euler map of x' = x − x³, y' = −y (dt 0.1): saddle (0, 0) with eigenvalues 1.1, 0.9;
    stable nodes (±1, 0) with 0.8, 0.9."""
    dt = 0.1

    def fn(h):
        return torch.stack([h[0] + dt * (h[0] - h[0] ** 3), h[1] - dt * h[1]])

    starts = np.array([[0.05, 0.3], [1.3, -0.2], [-0.7, 0.4], [0.9, 0.1]])
    fp = find_fixed_points(fn, starts, basis=np.array([[1.0], [0.0]]))
    assert fp.count == 3
    by_x = {round(float(p[0])): i for i, p in enumerate(fp.points)}
    assert set(by_x) == {-1, 0, 1}
    s = by_x[0]
    np.testing.assert_allclose(fp.points[s], [0.0, 0.0], rtol=1e-7, atol=1e-14)
    np.testing.assert_allclose(np.sort(fp.eig[s].real), [0.9, 1.1], rtol=1e-7, atol=1e-12)
    assert not fp.stable[s] and fp.rho_par[s] == pytest.approx(1.1) and fp.rho_perp[s] == pytest.approx(0.9)
    for k in (-1, 1):
        i = by_x[k]
        np.testing.assert_allclose(fp.points[i], [k, 0.0], rtol=1e-7, atol=1e-12)
        np.testing.assert_allclose(np.sort(fp.eig[i].real), [0.8, 0.9], rtol=1e-7, atol=1e-12)
        assert fp.stable[i]


def test_newton_first_ends_where_the_lm_solve_ends_and_leaves_it_the_rest():
    """Near the saddle and the nodes of the map above, the batched Newton steps accept every
    start and end where scipy's LM (method 'lm', run here on its own) ends; on a map without
    a fixed point they accept none, and solve() reports the LM's residual."""
    dt = 0.1

    def fn(h):
        return torch.stack([h[0] + dt * (h[0] - h[0] ** 3), h[1] - dt * h[1]])

    starts = np.array([[0.03, -0.02], [1.04, 0.03], [-0.97, -0.04], [0.96, 0.0]])
    pts, res, ok = newton_all(fn, starts)
    assert ok.all() and (res <= NEWTON_ACCEPT).all()
    f, df = numpy_map(fn)
    for start, p in zip(starts, pts):
        lm = scipy.optimize.least_squares(lambda h: f(h) - h, start, jac=lambda h: df(h) - np.eye(2), method="lm",
                                          xtol=1e-15, ftol=1e-15, gtol=1e-15)
        np.testing.assert_allclose(p, lm.x, rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(solve(fn, starts).points, pts, rtol=0, atol=0)

    def branching(h):  # Python control flow on a value: vmap cannot batch it, the rows are solved one by one
        return fn(h) if float(h[0]) > -10.0 else h

    np.testing.assert_allclose(newton_all(branching, starts)[0], pts, rtol=0, atol=1e-15)
    np.testing.assert_allclose(jacobians(branching, starts), jacobians(fn, starts), rtol=0, atol=1e-15)

    def ghost(h):
        return h + 0.1 + h**2

    x0 = np.array([[-1.0], [0.4]])
    assert not newton_all(ghost, x0)[2].any()
    np.testing.assert_allclose(solve(ghost, x0).residuals, [0.1, 0.1], rtol=0, atol=1e-8)


# -- no fixed point; slow points --------------------------------------------------------------------


def test_map_without_fixed_point_reports_none_and_its_slow_point():
    """F(x) = x + 0.1 + x² never returns (F − x ≥ 0.1): no fixed point; the one slow point
    is x = 0 with speed q = ½·0.1² (the ghost of a saddle-node)."""

    def fn(h):
        return h + 0.1 + h**2

    starts = np.array([[-1.0], [-0.2], [0.4], [2.0]])
    fp = find_fixed_points(fn, starts)
    assert not fp.affine and not fp.found and fp.count == 0
    assert fp.best_residual == pytest.approx(0.1, rel=0, abs=1e-8)
    slow = find_slow_points(fn, starts)
    assert slow.points.shape == (1, 1) and slow.hits[0] == 4
    assert slow.points[0, 0] == pytest.approx(0.0, rel=0, abs=1e-9)
    assert slow.speeds[0] == pytest.approx(0.005, rel=1e-9, abs=1e-12)
    assert slow.eig[0, 0].real == pytest.approx(1.0, rel=0, abs=1e-9)


def test_map_without_fixed_point_reports_none_with_orbit_starts_too():
    """The orbits of F(x) = x + 0.1 + x² run off to infinity: they give no start, and still none."""
    fp = find_fixed_points(lambda h: h + 0.1 + h**2, np.array([[-1.0], [0.4]]), iterate=200)
    assert not fp.found and fp.count == 0 and fp.extra["orbit_starts"] == 0
    assert fp.best_residual == pytest.approx(0.1, rel=0, abs=1e-8)


# -- orbit starts -------------------------------------------------------------------------------


def test_orbit_starts_reach_a_fixed_point_the_solve_cannot():
    """F(h) = h − ½·clamp(h, −1, 1): where every entry is saturated DF = I, so the solve has a
    zero Jacobian and stays at its start (residual ½·sqrt(3)); the orbit walks to the stable
    fixed point 0 (DF = ½ I there), which the orbit starts give exactly."""

    def fn(h):
        return h - 0.5 * torch.clamp(h, -1.0, 1.0)

    starts = np.array([[3.0, -4.0, 2.5], [5.0, 2.0, -3.0]])
    plain = find_fixed_points(fn, starts)
    assert not plain.found and plain.best_residual == pytest.approx(0.5 * np.sqrt(3), rel=1e-12, abs=1e-12)
    fp = find_fixed_points(fn, starts, iterate=50)
    assert fp.found and fp.count == 1 and fp.extra["orbit_starts"] == 2
    assert np.abs(fp.points[0]).max() < 1e-12 and fp.best_residual < 1e-12
    assert fp.rho[0] == pytest.approx(0.5, rel=0, abs=1e-12) and fp.stable[0]


def test_orbit_mean_is_the_focus_inside_an_invariant_circle():
    """z -> e^{iθ} z (1.2 − |z|²) in the plane (a Neimark–Sacker normal form): the orbits settle
    on the attracting circle |z|² = 0.2, the mean of an orbit is near its centre, and the
    fixed point there is a repelling focus (eigenvalues 1.2·e^{±iθ})."""
    th = 0.7
    rot = torch.tensor([[np.cos(th), -np.sin(th)], [np.sin(th), np.cos(th)]], dtype=torch.float64)

    def fn(h):
        return (rot @ h) * (1.2 - (h * h).sum())

    more = orbit_starts(fn, np.array([[0.5, 0.1]]), 400)
    assert more.shape == (2, 2)
    assert (more[0] ** 2).sum() == pytest.approx(0.2, rel=0, abs=1e-9)
    assert np.linalg.norm(more[1]) < 0.01
    fp = find_fixed_points(fn, more)
    assert fp.found and np.abs(fp.points[0]).max() < 1e-12
    assert fp.rho[0] == pytest.approx(1.2, rel=0, abs=1e-12) and not fp.stable[0]
    assert _sorted_eig(fp.eig[0]) == pytest.approx(_sorted_eig(1.2 * np.exp([-1j * th, 1j * th])), rel=0, abs=1e-12)


def test_orbit_starts_refuse_no_iterations():
    with pytest.raises(ValueError, match="iterate"):
        orbit_starts(lambda h: h, np.zeros((1, 2)), 0)


def test_slow_points_of_the_flip_flop_are_its_fixed_points():
    tr = _flip_flop_tracker()
    slow = find_slow_points(word_map(tr, [0]), np.array([[0.8, 0.7], [-0.9, 1.0]]))
    np.testing.assert_allclose(slow.speeds, 0.0, rtol=1e-7, atol=1e-24)
    np.testing.assert_allclose(np.abs(slow.points), H_STAR, rtol=1e-7, atol=1e-10)


def test_deduplicate_keeps_the_best_representative_and_counts_hits():
    pts = np.array([[0.0, 0.0], [1e-9, 0.0], [1.0, 1.0], [0.0, 2e-9]])
    u, r, hits = deduplicate(pts, np.array([3e-12, 1e-12, 5e-13, 2e-12]), 1e-6)
    assert u.shape == (2, 2) and list(hits) == [3, 1]
    np.testing.assert_array_equal(u[0], [1e-9, 0.0])  # the smallest residual of its cluster
    assert r[0] == 1e-12
