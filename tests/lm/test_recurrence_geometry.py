"""dynlab.lm.analysis.state_geometry: the LM recurrence's Jacobian (analytic and finite differences),
the per-distance geometry against an independent computation, probes and censoring."""

from __future__ import annotations

import re

import numpy as np
import pytest
import torch
from torch import nn

from dynlab.lm.analysis.state_geometry import censored_first_below, distance_geometry, model_task_geometry, probe_accuracy  # noqa: F401
from dynlab.lm.analysis.recurrence import LMRecurrence, filler_fixed_points, recurrence_spectra, state_jacobians
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.models.states import CarriedStates
from dynlab.lm.data.tasks import make_task


class DecayLM(nn.Module):
    """A linear 'LM' whose recurrence is h_t = a ⊙ h_{t-1} + E[x_t]: Jacobian diag(a)."""

    def __init__(self, a: torch.Tensor) -> None:
        super().__init__()
        self.a = nn.Parameter(a.reshape(1, 1, -1, 1), requires_grad=False)
        self.emb = nn.Embedding(256, a.numel())

    def state_shapes(self):
        return [(1, self.a.numel(), 1)]

    def conv_shapes(self):
        return [None]

    def forward(self, tokens, states=None):
        b = tokens.shape[0]
        h = torch.zeros(b, 1, self.a.numel(), 1, dtype=self.a.dtype) if states is None else states[0]
        outs = []
        for t in range(tokens.shape[1]):
            h = self.a * h + self.emb(tokens[:, t]).reshape(b, 1, -1, 1).to(h.dtype)
            outs.append(h.reshape(b, -1))
        logits = torch.stack(outs, 1) @ torch.ones(self.a.numel(), 256, dtype=h.dtype)
        return logits, CarriedStates([h], [None])


def test_jacobian_of_a_diagonal_decay_recurrence_is_diag_a():
    a = torch.tensor([0.9, 0.5, -0.3, 0.99], dtype=torch.float64)
    rec = LMRecurrence(DecayLM(a).double())
    h = torch.randn(3, 4, dtype=torch.float64)
    jac = state_jacobians(rec, h, torch.tensor([1, 2, 3]))
    np.testing.assert_allclose(jac, np.broadcast_to(np.diag(a.numpy()), (3, 4, 4)), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("mixer", ["mamba2", "mamba1", "gla"])
def test_lm_jacobian_matches_finite_differences(mixer):
    kw = {"n_heads": 2, "head_dim": 8, "d_state": 8} if mixer == "mamba2" else {}
    lm = RecurrentLM(mixer, d_model=16, n_layers=2, generator=torch.Generator().manual_seed(1), **kw).double()
    rec = LMRecurrence(lm)
    tokens = torch.randint(0, 256, (2, 12), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        _, st = lm(tokens[:, :-1])
        h = rec.flatten(st)
    # the flat step equals the LM run on the whole sequence
    _, whole = lm(tokens)
    np.testing.assert_allclose(rec.step(h, tokens[:, -1])[1].detach().numpy(), rec.flatten(whole).detach().numpy(),
                               rtol=1e-10, atol=1e-12)
    jac = state_jacobians(rec, h, tokens[:, -1])
    rng = np.random.default_rng(0)
    eps = 1e-6
    for _ in range(3):
        v = torch.as_tensor(rng.standard_normal(h.shape[1]))
        with torch.no_grad():
            plus = rec.step(h + eps * v, tokens[:, -1])[1]
            minus = rec.step(h - eps * v, tokens[:, -1])[1]
        fd = ((plus - minus) / (2 * eps)).numpy()
        np.testing.assert_allclose(np.einsum("bij,j->bi", jac, v.numpy()), fd, rtol=1e-5, atol=1e-7)


def test_spectra_split_on_the_decay_recurrence():
    """U spans the first two coordinates (class means differ there only): rho_par = max|a| on them."""
    a = torch.tensor([0.9, 0.5, -0.3, 0.2], dtype=torch.float64)
    lm = DecayLM(a).double()
    with torch.no_grad():
        lm.emb.weight.zero_()
        lm.emb.weight[1, 0] = 1.0
        lm.emb.weight[2, 1] = 1.0
    tokens = torch.tensor([[0, 1, 0], [0, 2, 0], [0, 1, 0], [0, 2, 0], [0, 0, 0], [0, 0, 0]])
    labels = np.array([0, 1, 0, 1, 2, 2])
    out = recurrence_spectra(lm, tokens, labels, 3, n_jac=2)
    assert out["rho"] == pytest.approx(0.9, rel=1e-12, abs=1e-12)
    assert out["rho_par"] == pytest.approx(0.9, rel=1e-12, abs=1e-12)
    assert out["rho_perp"] == pytest.approx(0.3, rel=1e-12, abs=1e-12)
    fp = filler_fixed_points(lm, tokens, labels, 3, filler=0)
    assert fp["fp_count"] == 1 and fp["fp_residual"] <= 1e-12  # h* = 0 under a zero input
    assert fp["fp_rho_perp"] == pytest.approx(0.3, rel=1e-12, abs=1e-12)


def test_distance_geometry_against_a_direct_computation():
    rng = np.random.default_rng(3)
    n, s, dist = 60, 5, (2, 4, 8)
    y = rng.integers(0, 3, size=(n, len(dist)))
    means = np.eye(3, s) * 2.0
    spread = np.array([0.2, 1.0, 4.0])
    h = means[y] + rng.standard_normal((n, len(dist), s)) * spread[None, :, None]
    ds = distance_geometry(h, y, [0.9, 0.6, 0.4], dist, 3, probe=False)
    for j in range(len(dist)):
        c = np.stack([h[y[:, j] == g, j].mean(0) for g in range(3)])
        r = np.sqrt(((h[:, j] - c[y[:, j]]) ** 2).sum() / (n - 3))
        m = min(np.linalg.norm(c[g] - c[k]) for g in range(3) for k in range(3) if g != k)
        assert ds.q.values[j] == pytest.approx(r / m, rel=1e-10, abs=0)
    q = ds.q.values
    first = next(d for d, v in zip(dist, q) if v >= 1.0)
    assert ds.T_cross.item() == first and bool(ds.crossed)
    assert ds.horizon.item() == 8 and bool(ds.horizon_reached)


def test_censoring_at_the_largest_distance():
    assert censored_first_below([0.9, 0.8], [4, 8], 0.5) == (8.0, False)
    assert censored_first_below([0.9, 0.4, 0.1], [4, 8, 16], 0.5) == (8.0, True)
    h = np.zeros((20, 2, 3))
    y = np.tile(np.arange(2), 10)[:, None].repeat(2, 1)
    h[..., 0] = y * 10.0 + np.random.default_rng(0).standard_normal((20, 2)) * 0.1
    ds = distance_geometry(h, y, [1.0, 1.0], (4, 8), 2, probe=False)
    assert not bool(ds.crossed) and ds.T_cross.item() == 8.0


def test_probe_reads_a_separable_variable_and_not_noise():
    rng = np.random.default_rng(4)
    y = rng.integers(0, 4, 200)
    sep = np.eye(4, 6)[y] * 5 + rng.standard_normal((200, 6))
    assert probe_accuracy(sep, y) > 0.95
    assert probe_accuracy(rng.standard_normal((200, 6)), y) < 0.45


@pytest.mark.parametrize("kind", ["passkey", "copying"])
def test_model_task_geometry_labels_are_the_carried_variable(kind):
    """An oracle 'state' (the one-hot of the label itself) gives q = 0 and a perfect probe."""
    from dynlab.lm.analysis.state_geometry import task_probes
    task = make_task("copying") if kind == "copying" else make_task("passkey", torch.randint(97, 123, (5000,)))
    tokens, position, batch, labels = task_probes(kind, task, torch.Generator().manual_seed(0), 40, 8)
    if kind == "copying":
        assert (tokens[:, position - 1] == ord("|")).all()
        np.testing.assert_array_equal(labels, (batch.tokens[:, position] - ord("a")).numpy())
    else:
        text = [bytes(r).decode() for r in tokens[:, :position].tolist()]
        assert all(t.split("The pass key is ")[1][4] == str(l) for t, l in zip(text, labels))
    lm = RecurrentLM("mamba2", d_model=16, n_layers=1, n_heads=2, head_dim=8, d_state=8)
    ds, _ = model_task_geometry(lm, kind, task, 0, n=40, distances=(4, 8), probe=False)
    assert ds.q.dims == ("distance",) and np.isfinite(ds.q).all()


@pytest.fixture(scope="module")
def smoke_passkey(tmp_path_factory):
    """A real smoke passkey study, analysed by `dynlab analyze` with few probe samples."""
    from typer.testing import CliRunner
    import dynlab.lm.analysis.state_geometry as geo
    from dynlab.cli import app

    out = tmp_path_factory.mktemp("pk")
    mp = pytest.MonkeyPatch()
    mp.setattr(geo, "PROBE_SAMPLES", 40)
    mp.setitem(geo.DISTANCES, "passkey", (8, 32))
    runner = CliRunner()
    res = runner.invoke(app, ["study", "passkey", "--preset", "smoke", "--out", str(out), "-q"])
    assert res.exit_code == 0, res.output
    res = runner.invoke(app, ["analyze", str(out / "passkey"), "-q"])
    mp.undo()
    assert res.exit_code == 0, res.output
    return out / "passkey"


@pytest.mark.slow
def test_dynlab_analyze_puts_the_geometry_in_the_task_dataset(smoke_passkey):
    import xarray as xr

    from dynlab.results.vocabulary import check_dataset
    ds = xr.load_dataset(smoke_passkey / "dataset.nc")
    assert ds.geo_q.dims == ("run", "distance") and list(ds.distance.values) == [8, 32]
    assert ds.geo_q.attrs["units"] == "1" and ds.geo_T_cross.attrs["units"] == "tokens"
    assert check_dataset(ds) == []
    for i in range(ds.sizes["run"]):  # the stored T_cross and horizon follow the pre-registered rule
        q, acc, d = ds.geo_q.values[i], ds.geo_accuracy.values[i], ds.distance.values
        want = next((x for x, v in zip(d, q) if v >= 1.0), d[-1])
        assert ds.geo_T_cross.values[i] == want
        assert ds.geo_horizon.values[i] == next((x for x, v in zip(d, acc) if v < 0.5), d[-1])
    assert set(ds.intervention.values) >= {"zero", "fitted-noise", "state-passing"}
    assert np.isfinite(ds.geo_rho_perp).all() and (ds.geo_fp_residual <= 1e-8).all()


@pytest.mark.slow
def test_geometry_figures_draw_the_dataset_of_a_real_run(smoke_passkey, tmp_path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import xarray as xr

    from dynlab.cli import main
    from dynlab.lm.figures.tasks import geometry_q_panel, geometry_tcross_panel
    ds = xr.load_dataset(smoke_passkey / "dataset.nc")
    fig, ax = plt.subplots()
    geometry_q_panel(ds, ax)
    arms = ds.isel(run=np.flatnonzero(ds.phase.values.astype(str) == "post"))
    zero = arms.isel(run=np.flatnonzero(arms.intervention.values.astype(str) == "zero"))
    line = next(l for l in ax.get_lines() if l.get_label().startswith("zero"))
    np.testing.assert_allclose(line.get_ydata(), zero.geo_q.mean("run").values, rtol=1e-12, atol=0)
    twin = [a for a in fig.axes if a is not ax][0]
    assert any(np.allclose(l.get_ydata(), zero.geo_accuracy.mean("run").values) for l in twin.get_lines())
    plt.close(fig)
    fig, ax = plt.subplots()
    geometry_tcross_panel(ds, ax)
    pts = np.concatenate([c.get_offsets() for c in ax.collections])
    want = np.stack([ds.geo_T_cross.values, ds.geo_horizon.values], 1)
    assert sorted(map(tuple, pts.tolist())) == sorted(map(tuple, want.tolist()))
    censored = ~ds.geo_crossed.values.astype(bool) | ~ds.geo_horizon_reached.values.astype(bool)
    drawn_censored = sum(len(c.get_offsets()) for c in ax.collections if "censored" in str(c.get_gid()))
    assert drawn_censored == int(censored.sum())
    both = ~ds.geo_crossed.values.astype(bool) & ~ds.geo_horizon_reached.values.astype(bool)
    assert sum(len(c.get_offsets()) for c in ax.collections if c.get_gid() == "both censored") == int(both.sum())
    plt.close(fig)
    assert main(["figures", str(smoke_passkey), "--out", str(tmp_path / "figs")]) == 0
    assert (tmp_path / "figs" / "passkey_geometry_q.png").is_file()
    assert (tmp_path / "figs" / "passkey_geometry_tcross.png").is_file()


def test_preregistered_test_on_a_known_relation():
    """Horizon = T_cross exactly on observed runs: r = 1; the censored ones enter at the bound."""
    import xarray as xr

    from dynlab.lm.analysis.state_geometry import preregistered_test
    t = np.array([8, 16, 32, 64, 64, 128])
    crossed = np.array([True, True, True, True, True, False])
    h = np.array([8, 16, 32, 64, 64, 128])
    ds = xr.Dataset({"geo_T_cross": ("run", t.astype(float)), "geo_crossed": ("run", crossed),
                     "geo_horizon": ("run", h.astype(float)), "geo_horizon_reached": ("run", crossed),
                     "status": ("run", ["ok"] * 6)},
                    coords={"distance": [8, 16, 32, 64, 128], "intervention": ("run", ["zero", "sp"] * 3),
                            "phase": ("run", ["post"] * 6)})
    out = preregistered_test({"a": ds, "b": ds.assign(geo_horizon=("run", h[::-1].astype(float)))}, n_boot=200)
    assert out["a"]["pearson_r"] == pytest.approx(1.0, rel=1e-12, abs=1e-12)
    assert out["a"]["n_tcross_censored"] == 1 and out["a"]["n"] == 6
    assert out["b"]["pearson_r"] < -0.9
    assert out["a"]["arms"]["zero"]["log2_T_cross"] == pytest.approx(np.log2([8, 32, 64]).mean(), rel=1e-12, abs=0)
    assert out["pooled"]["n"] == 12


@pytest.mark.parametrize("mixer", ["mamba2", "gla"])
def test_layer_jacobian_is_the_block_of_the_full_one(mixer):
    from dynlab.lm.analysis.recurrence import layer_jacobians
    kw = {"n_heads": 2, "head_dim": 4, "d_state": 4} if mixer == "mamba2" else {}
    lm = RecurrentLM(mixer, d_model=8, n_layers=2, generator=torch.Generator().manual_seed(3), **kw).double()
    rec = LMRecurrence(lm)
    tokens = torch.randint(0, 256, (2, 6), generator=torch.Generator().manual_seed(4))
    with torch.no_grad():
        h = rec.flatten(lm(tokens[:, :-1])[1])
    full = state_jacobians(rec, h, tokens[:, -1])
    sl = rec.layer_slice(-1)
    np.testing.assert_allclose(layer_jacobians(rec, h, tokens[:, -1]), full[:, sl, sl], rtol=1e-10, atol=1e-12)


def test_gla_step_jacobian_is_batched_and_equals_independent_ones():
    """GLA's one-token step runs under torch.func (vmap of jacrev, no per-sample fallback):
    its Jacobians equal torch.autograd.functional.jacobian of each sample's step, and the
    last layer's own-state block is the analytic diag(exp(g_t)) of S_t = diag(exp(g_t)) S_{t-1} + k_t v_tᵀ
    (that layer's gates, keys and values do not depend on its own state)."""
    from dynlab.analysis.jacobian import step_jacobians
    from dynlab.lm.analysis.recurrence import layer_jacobians

    lm = RecurrentLM("gla", d_model=8, n_layers=2, n_heads=2, key_dim=4, value_dim=3,
                     generator=torch.Generator().manual_seed(5)).double()
    rec = LMRecurrence(lm)
    tokens = torch.randint(0, 256, (3, 7), generator=torch.Generator().manual_seed(6))
    with torch.no_grad():
        h = rec.flatten(lm(tokens[:, :-1])[1])
    x = tokens[:, -1]
    batched = step_jacobians(rec, h, x).numpy()  # raises if the GLA step cannot be vmapped
    np.testing.assert_allclose(state_jacobians(rec, h, x), batched, rtol=0, atol=0)
    for i in range(h.shape[0]):
        one = torch.autograd.functional.jacobian(lambda s: rec.step(s[None], x[i:i + 1])[1][0], h[i])
        np.testing.assert_allclose(batched[i], one.numpy(), rtol=1e-12, atol=1e-14)
    gates = []  # the last layer's gate projection at the step: g = logsigmoid(W_g x) / 16, [B, H·K]
    mixer = lm.blocks[-1].mixer
    hook = mixer.qkvg_proj.register_forward_hook(lambda m, a, out: gates.append(out[:, -1, 16:24]))
    with torch.no_grad():
        rec.step(h, x)
    hook.remove()
    decay = torch.exp(torch.nn.functional.logsigmoid(gates[0]) / mixer.gate_normalizer)  # [B, H·K]
    analytic = np.stack([np.diag(d.repeat_interleave(3).numpy()) for d in decay])  # state [H, K, V] flat
    np.testing.assert_allclose(layer_jacobians(rec, h, x), analytic, rtol=1e-12, atol=1e-14)
    assert np.abs(batched - np.stack([np.eye(rec.state_size)] * 3)).max() > 1e-3  # not the identity


@pytest.mark.parametrize("tokens", ["bytes", "words"])
def test_babi_probes_carry_the_room_of_the_last_mover(tokens):
    """The label is the room the asked person last went to, read back from the text itself;
    the state read sits right after the filler, d tokens after that last move; the scored
    tokens are the answer, which spells the labelled room."""
    from dynlab.lm.data.babi import ROOMS, BabiTask, babi_decode

    stream = torch.tensor(list(b"the quick brown fox jumps over the lazy dog " * 200))
    task = BabiTask(stream, kinds=("qa1",), n_facts=3, tokens=tokens)
    d = 16
    batch, position, labels = task.probe_samples(torch.Generator().manual_seed(0), 30, d)
    assert labels.min() >= 0 and labels.max() < len(ROOMS) and len(set(labels.tolist())) > 1
    def text(ids) -> str:  # words mode decodes each word token as ⟨word⟩: back to plain words
        plain = " ".join(re.sub(r"⟨([^⟩]*)⟩", r" \1 ", babi_decode(ids)).split())
        return plain.replace(" .", ".").replace(" ?", "?")

    for row, mask, label in zip(batch.tokens, batch.mask, labels):
        before = text(row[:position - d].tolist())
        ask = text(row[position:].tolist())
        person = ask.split("Where is ")[1].split("?")[0]
        moves = [s for s in before.split(".") if " went to the " in s]
        assert moves[-1].strip().startswith(person)  # the person asked about moved last
        assert moves[-1].strip().endswith(ROOMS[label])  # to the labelled room
        assert text(row[1:][mask].tolist()).strip() == ROOMS[label]


def test_babi_geometry_of_a_small_model_runs_end_to_end():
    from dynlab.lm.analysis.state_geometry import geometry_row
    from dynlab.lm.data.babi import BabiTask

    stream = torch.tensor(list(b"the quick brown fox jumps over the lazy dog " * 200))
    task = BabiTask(stream, kinds=("qa1",), n_facts=3)
    lm = RecurrentLM("mamba2", d_model=16, n_layers=1, n_heads=2, head_dim=8, d_state=8)
    ds = geometry_row(lm, "babi", task, 0, n=36, distances=(8, 16), n_jac=2)
    assert ds.geo_q.dims == ("distance",) and np.isfinite(ds.geo_q).all()
    assert np.isfinite(ds.geo_rho).all() and "geo_fp_count" in ds  # the filler fixed points were searched
