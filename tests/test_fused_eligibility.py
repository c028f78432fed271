"""Kernel eligibility is declared by class attributes (``Cell.fused``, ``Cell.fast_scan``,
``Tracker.fused_ok``) that a subclass overriding a method loses; ensembles follow ``fused``."""

import pytest
import torch
import torch.nn.functional as F

from dynlab.tracking.spec import CurriculumSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec
from dynlab.kernels.tracker_loss import dense as dense_tracker
from dynlab.tracking.models import Tracker, registry
from dynlab.tracking.models.cell_base import Cell
from dynlab.tracking.models.cells import (
    AUSSMCell,
    LinearRNNCell,
    Mamba3Cell,
    MambaCell,
    NegativeMambaCell,
    StateGatedRNNCell,
    TanhRNNCell,
    TokenGatedRNNCell,
)
from dynlab.tracking.train import train_tracker
from dynlab.tracking.train.engine import fused_kind, runs_generic_loop, tracker_loss


class DoubledTanh(TanhRNNCell):
    """h_t = tanh(2·A h_{t−1} + B x̃_t + b): a recurrence the dense kernel does not compute."""

    def transition(self, h, p):
        return torch.tanh(2.0 * self._ah(h) + p["drive"])


@pytest.fixture
def doubled_arch(monkeypatch):
    """``DoubledTanh`` registered as ``test-doubled-tanh`` for this test only."""
    monkeypatch.setitem(registry._REGISTRY, "test-doubled-tanh", DoubledTanh)
    return "test-doubled-tanh"


def test_builtin_cells_declare_their_kernels():
    declared = {
        cls: (cls.fused, cls.fast_scan)
        for cls in (LinearRNNCell, TanhRNNCell, TokenGatedRNNCell, StateGatedRNNCell,
                    MambaCell, NegativeMambaCell, AUSSMCell, Mamba3Cell)
    }
    assert declared == {
        LinearRNNCell: ("dense", True), TanhRNNCell: ("dense", True),
        TokenGatedRNNCell: ("token-gated", True), StateGatedRNNCell: ("state-gated", False),
        MambaCell: ("diagonal", True), NegativeMambaCell: ("diagonal", True),
        AUSSMCell: ("diagonal-aussm", True), Mamba3Cell: ("diagonal-mamba3", True),
    }
    assert (Cell.fused, Cell.fast_scan) == (None, False)


@pytest.mark.parametrize("name", ["step", "forward", "precompute", "transition", "readout", "scan", "init_state",
                                  "__init__", "_ah", "_gate", "extra_repr"])
def test_overriding_any_method_loses_the_kernels(name):
    body = {name: lambda self, *a, **k: None}
    for base in (TanhRNNCell, TokenGatedRNNCell, StateGatedRNNCell, MambaCell):
        if not hasattr(base, name):  # a new name overrides nothing
            continue
        sub = type(f"Own_{name}", (base,), dict(body))
        assert sub.fused is None and sub.fast_scan is False, (base.__name__, name)
        assert base.fused == {"TanhRNNCell": "dense", "TokenGatedRNNCell": "token-gated",
                              "StateGatedRNNCell": "state-gated", "MambaCell": "diagonal"}[base.__name__]  # base untouched


def test_subclass_without_overrides_keeps_the_kernels_and_redeclaring_restores_them():
    class Renamed(TanhRNNCell):  # data attributes only: the same computation
        pointwise_precompute = True

    class Helper(TanhRNNCell):  # a new method that overrides nothing
        def describe(self):
            return "tanh"

    class Redeclared(TokenGatedRNNCell):  # the override keeps the recurrence, and says so
        fused = "token-gated"

        def extra_repr(self):
            return "mine"

    assert (Renamed.fused, Renamed.fast_scan) == ("dense", True)
    assert (Helper.fused, Helper.fast_scan) == ("dense", True)
    assert (Redeclared.fused, Redeclared.fast_scan) == ("token-gated", False)
    model = Tracker("token-gated-rnn", 4, 4, hidden=8)
    model.cells[0] = Redeclared(8, 8)
    assert fused_kind(model) == "token-gated"
    with pytest.raises(ValueError, match=r"Bad\.fused = 'dens'; allowed: None, dense, token-gated, state-gated"):
        type("Bad", (TanhRNNCell,), {"fused": "dens"})


def test_tracker_subclass_overriding_a_method_is_not_fused():
    class OwnStep(Tracker):
        def step(self, state, tokens):
            return super().step(state, tokens)

    class Declared(OwnStep):
        fused_ok = True

    assert Tracker("tanh-rnn", 4, 4, hidden=8).fused_kind() == "dense"
    assert OwnStep("tanh-rnn", 4, 4, hidden=8).fused_kind() is None
    assert Declared("tanh-rnn", 4, 4, hidden=8).fused_kind() == "dense"
    model = Tracker("tanh-rnn", 4, 4, hidden=8)
    model.extra = torch.nn.Parameter(torch.zeros(1))  # a parameter the kernel would ignore
    assert fused_kind(model) is None
    model = Tracker("tanh-rnn", 4, 4, hidden=8)
    model.embed = torch.nn.Embedding(4, 8, padding_idx=0)  # zero gradient on row 0: not the kernel's
    assert fused_kind(model) is None


def _doubled_loss(model, tokens, labels, scale):
    """Mean cross-entropy of h_t = tanh(scale·A h_{t−1} + B e_{x_t} + b), written out."""
    cell = model.cells[0]
    emb = model.embed.weight[tokens]  # [B, T, D]
    h = torch.zeros(tokens.shape[0], cell.hidden, dtype=emb.dtype)
    logits = []
    for t in range(tokens.shape[1]):
        h = torch.tanh(scale * h @ cell.A.T + emb[:, t] @ cell.B.weight.T + cell.B.bias)
        logits.append(h @ model.readout.weight.T + model.readout.bias)
    return F.cross_entropy(torch.stack(logits, 1).flatten(0, 1), labels.flatten())


def test_cell_overriding_the_recurrence_trains_its_own_recurrence(doubled_arch):
    """Not fused, and the training loss (value and gradient) is the subclass's recurrence,
    not the dense kernel's (which differs by more than the tolerance)."""
    torch.manual_seed(0)
    model = Tracker(doubled_arch, 5, 5, hidden=6, d_embed=4).double()
    assert fused_kind(model) is None and not model.cells[0].fast_scan_ok()
    assert runs_generic_loop(model)
    gen = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, 5, (6, 9), generator=gen)
    labels = torch.randint(0, 5, (6, 9), generator=gen)
    params = list(model.parameters())
    loss, _ = tracker_loss(model, tokens, labels)
    got = torch.autograd.grad(loss, params)
    want_loss = _doubled_loss(model, tokens, labels, 2.0)
    want = torch.autograd.grad(want_loss, params)
    torch.testing.assert_close(loss, want_loss, rtol=1e-12, atol=1e-12)
    for (name, _), a, b in zip(model.named_parameters(), got, want):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-12, msg=name)
    with torch.no_grad():  # the parent's model (what the dense kernel computes) differs
        assert abs(float(_doubled_loss(model, tokens, labels, 1.0) - want_loss)) > 1e-3


def test_training_a_cell_overriding_the_recurrence_never_runs_the_fused_kernel(doubled_arch, monkeypatch):
    def refuse(*args, **kwargs):
        raise AssertionError("the dense fused kernel ran")

    monkeypatch.setattr(dense_tracker._DenseTrackerLoss, "forward", staticmethod(refuse))
    train = TrainSpec(steps=4, batch_size=8, lr=1e-2, warmup_steps=1, curriculum=CurriculumSpec(min_length=3, max_length=5))

    def spec(arch):
        return RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch=arch, hidden=8), train=train, seed=2)

    res = train_tracker(spec(doubled_arch), torch.device("cpu"))
    assert res.status == "ok" and len(res.losses) == 4
    assert all(torch.isfinite(torch.tensor(res.losses)))
    with pytest.raises(AssertionError, match="dense fused kernel ran"):  # the spy does catch the kernel
        train_tracker(spec("tanh-rnn"), torch.device("cpu"))


def test_ensembles_stack_exactly_the_fused_architectures(doubled_arch):
    from dynlab.studies.group_tracking import ensemble_group_key

    def spec(arch, seed):
        return RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch=arch, hidden=8), seed=seed)

    for arch in ("tanh-rnn", "linear-rnn", "token-gated-rnn", "state-gated-rnn", "mamba", "negative-mamba",
                 "aussm", "mamba3"):
        assert ensemble_group_key(spec(arch, 0)) == ensemble_group_key(spec(arch, 1)), arch
    for arch in (doubled_arch,):
        assert ensemble_group_key(spec(arch, 0)) != ensemble_group_key(spec(arch, 1)), arch

    def with_phi(arch, phi, seed):  # the class declares a kernel; this instance's φ is not one it computes
        model = ModelSpec(arch=arch, hidden=8, nonlinearity=phi)
        return RunSpec(task=TaskSpec(group="S3"), model=model, seed=seed)

    for arch, phi in (("mamba", "tanh"), ("aussm", "relu"), ("tanh-rnn", "relu")):
        assert ensemble_group_key(with_phi(arch, phi, 0)) != ensemble_group_key(with_phi(arch, phi, 1)), (arch, phi)


class RedeclaredTanh(TanhRNNCell):
    """An override that keeps the dense recurrence and declares the kernel again."""

    fused = "dense"

    def extra_repr(self):
        return "redeclared"


@pytest.fixture
def user_archs(monkeypatch, doubled_arch):
    """A user cell that loses the kernel (``doubled_arch``) and one that declares it again."""
    monkeypatch.setitem(registry._REGISTRY, "test-redeclared-tanh", RedeclaredTanh)
    return [doubled_arch, "test-redeclared-tanh"]


def _model_specs(archs):
    """Every architecture × φ (default and each nonlinearity) × layers × readout, width 8."""
    from dynlab.tracking.models import NONLINEARITIES

    return [ModelSpec(arch=a, hidden=8, nonlinearity=phi, layers=n, readout=r)
            for a in archs for phi in (None, *NONLINEARITIES) for n in (1, 2) for r in ("linear", "mlp")]


def test_declared_fused_kind_agrees_with_the_built_tracker(user_archs):
    from dynlab.tracking.models import BUILTIN_ARCHS
    from dynlab.tracking.models.tracker import declared_fused_kind

    seen = set()
    for m in _model_specs([*BUILTIN_ARCHS, *user_archs]):
        built = Tracker(m.arch, 6, 6, hidden=m.hidden, layers=m.layers, nonlinearity=m.nonlinearity,
                        readout=m.readout).fused_kind()
        assert declared_fused_kind(m.arch, layers=m.layers, nonlinearity=m.nonlinearity,
                                   readout=m.readout) == built, m
        seen.add(built)
    assert seen == {None, "dense", "token-gated", "state-gated", "diagonal", "diagonal-aussm", "diagonal-mamba3"}


def _groups(specs, key):
    """The partition of ``range(len(specs))`` that grouping by ``key`` gives, as sorted lists."""
    out: dict = {}
    for i, s in enumerate(specs):
        out.setdefault(key(s), []).append(i)
    return sorted(out.values())


@pytest.mark.slow
def test_ensemble_group_key_groups_as_building_the_tracker_did(user_archs):
    """The spec-only key against the key that built a tracker to ask its fused kernel (the
    rule before it was read from the spec), on specs that must and must not share an
    ensemble: over groups of equal and different order, batch sizes, seeds, widths, φ,
    depth, readout and user cells."""
    from dynlab.tracking.groups import get_group
    from dynlab.tracking.models import BUILTIN_ARCHS
    from dynlab.studies.group_tracking import ensemble_group_key

    def built_key(spec):
        order = get_group(spec.task.group).order
        if Tracker(spec.model.arch, order, order, hidden=spec.model.hidden, layers=spec.model.layers,
                   nonlinearity=spec.model.nonlinearity, readout=spec.model.readout).fused_kind() is None:
            return spec.spec_hash()
        return (spec.model, spec.train.batch_size, order)

    models = _model_specs([*BUILTIN_ARCHS, *user_archs])
    models += [ModelSpec(arch="tanh-rnn", hidden=16), ModelSpec(arch="mamba", hidden=8, d_state=2),
               ModelSpec(arch="linear-rnn", hidden=8, d_embed=4)]
    specs = [RunSpec(task=TaskSpec(group=g), model=m, train=TrainSpec(batch_size=b), seed=s)
             for m in models for g in ("S3", "C6", "C2") for b in (8, 16) for s in (0, 1)]
    new, old = _groups(specs, ensemble_group_key), _groups(specs, built_key)
    assert new == old
    together = {tuple(g) for g in new}
    index = {(s.model, s.task.group, s.train.batch_size, s.seed): i for i, s in enumerate(specs)}

    def same(m, a, b):
        return any(index[(m, *a)] in g and index[(m, *b)] in g for g in together)

    tanh, mamba = ModelSpec(arch="tanh-rnn", hidden=8), ModelSpec(arch="mamba", hidden=8)
    assert same(tanh, ("S3", 8, 0), ("C6", 8, 1))  # S3 and C6: order 6, one stack
    assert same(ModelSpec(arch="test-redeclared-tanh", hidden=8), ("S3", 8, 0), ("S3", 8, 1))
    assert not same(tanh, ("S3", 8, 0), ("C2", 8, 0))  # another order
    assert not same(tanh, ("S3", 8, 0), ("S3", 16, 0))  # another batch size
    for m in (ModelSpec(arch="mamba", hidden=8, nonlinearity="tanh"), ModelSpec(arch="tanh-rnn", hidden=8, layers=2),
              ModelSpec(arch="tanh-rnn", hidden=8, readout="mlp"), ModelSpec(arch=user_archs[0], hidden=8)):
        assert not same(m, ("S3", 8, 0), ("S3", 8, 1)), m  # no fused kernel: alone
    assert not any(index[(tanh, "S3", 8, 0)] in g and index[(mamba, "S3", 8, 0)] in g for g in together)
