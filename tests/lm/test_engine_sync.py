"""The LM training step never waits for the host: losses and gradient checks are read back
every ``sync_every`` steps only, interventions keep their states and noise on the device;
bf16 autocast trains as float32 does, to a stated tolerance."""

from __future__ import annotations

import sys

import numpy as np
import pytest
import torch

from dynlab.lm.train.interventions import make_intervention
from dynlab.lm.data.loaders import RandomWindowLoader, SequentialChunkLoader
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.train.engine import batch_source, fit

HOST_READS = ("item", "cpu", "tolist", "numpy", "__bool__", "__float__", "__int__", "__index__")


def _model(mixer: str = "mamba2") -> RecurrentLM:
    kw = {"mamba2": dict(n_heads=2, head_dim=8, d_state=4), "gla": dict(n_heads=2, key_dim=4, value_dim=8),
          "mamba1": dict(d_inner=16, d_state=4, n_heads=2)}[mixer]
    return RecurrentLM(mixer, d_model=16, n_layers=2, chunk_size=8, generator=torch.Generator().manual_seed(0), **kw)


def _data() -> torch.Tensor:
    return torch.randint(0, 256, (20_000,), generator=torch.Generator().manual_seed(1), dtype=torch.int64).to(torch.uint8)


def _loader(kind: str, generator: torch.Generator):
    if kind == "tbtt":
        return SequentialChunkLoader(_data(), 4, 16)
    return RandomWindowLoader(_data(), 4, 16, generator)


class _HostReads:
    """Counts the host reads of tensors (``.item()``, ``.cpu()``, ``.tolist()``, ``bool(t)``, …)
    made by dynlab's own code (the caller's module), by name."""

    def __init__(self, monkeypatch) -> None:
        self.calls: list[str] = []
        for name in HOST_READS:
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, original))

    def _wrap(self, name, original):
        calls = self.calls

        def read(tensor, *args, **kwargs):
            caller = sys._getframe(1).f_globals.get("__name__", "")
            if caller.startswith("dynlab"):
                calls.append(f"{caller}.{name}")
            return original(tensor, *args, **kwargs)

        return read


@pytest.mark.parametrize("kind", ["zero", "random-noise", "fitted-noise", "state-passing", "tbtt"])
@pytest.mark.parametrize("mixer", ["mamba2", "gla", "mamba1"])
def test_a_training_step_reads_nothing_back_between_two_syncs(monkeypatch, kind, mixer):
    """12 steps read back every 4: exactly 3 read-backs of two lists (losses, gradient
    checks), and no other host read in dynlab's code (the step, the model, the
    intervention, the loader)."""
    model, generator = _model(mixer), torch.Generator().manual_seed(2)
    source = batch_source(_loader(kind, generator))
    reads = _HostReads(monkeypatch)
    res = fit(model, source, make_intervention(kind), generator, steps=12, batch_size=4, device="cpu",
              sync_every=4, warmup_frac=0.0)
    monkeypatch.undo()
    assert res.status == "ok" and len(res.losses) == 12
    assert reads.calls == ["dynlab.lm.train.engine.tolist"] * 6, reads.calls


def test_reading_back_less_often_gives_the_same_training():
    runs = []
    for every in (1, 5):
        model, generator = _model(), torch.Generator().manual_seed(3)
        res = fit(model, batch_source(_loader("state-passing", generator)), make_intervention("state-passing"),
                  generator, steps=10, batch_size=4, device="cpu", sync_every=every)
        runs.append((res.losses, [p.detach().clone() for p in model.parameters()]))
    assert runs[0][0] == runs[1][0]
    for a, b in zip(runs[0][1], runs[1][1]):
        assert torch.equal(a, b)


def test_a_failure_between_read_backs_is_reported_at_its_step():
    class NaNAtStep3(type(make_intervention("random-noise"))):
        calls = 0

        def initial_states(self, batch_size, shapes, fresh, generator):
            out = super().initial_states(batch_size, shapes, fresh, generator)
            NaNAtStep3.calls += 1
            if NaNAtStep3.calls == 4:
                out[0].view(-1)[0] = float("nan")
            return out

    generator = torch.Generator().manual_seed(4)
    res = fit(_model(), batch_source(_loader("zero", generator)), NaNAtStep3(0.1), generator, steps=10,
              batch_size=4, device="cpu", sync_every=5)
    assert res.status == "diverged" and res.reason == "non-finite loss at step 3 (length 16)"
    assert len(res.losses) == 3 and all(np.isfinite(res.losses))


@pytest.mark.parametrize("mixer", ["mamba2", "gla"])
def test_bf16_autocast_trains_as_float32_does(mixer):
    """60 steps on bytes: the bf16 loss curve stays within 2 % of the float32 one (mean
    relative gap over the last 20 steps) and falls as far; the weights stay float32 and the
    recurrent states come out float32."""
    curves = {}
    for precision in ("fp32", "bf16"):
        model, generator = _model(mixer), torch.Generator().manual_seed(5)
        text = torch.tensor(list(("the cat sat on the mat. " * 800).encode()), dtype=torch.uint8)
        res = fit(model, batch_source(RandomWindowLoader(text, 4, 32, generator)), make_intervention("zero"),
                  generator, steps=60, batch_size=4, lr=1e-2, device="cpu", precision=precision)
        assert res.status == "ok" and {p.dtype for p in model.parameters()} == {torch.float32}
        curves[precision] = np.asarray(res.losses)
        with torch.no_grad(), torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            _, finals = model(text[:32].long()[None], None)
        assert {s.dtype for s in finals} == {torch.float32}
    gap = np.abs(curves["bf16"][-20:] - curves["fp32"][-20:]) / curves["fp32"][-20:]
    assert gap.mean() < 0.02, gap.mean()
    assert curves["bf16"][-20:].mean() < 0.5 * curves["bf16"][:5].mean()


def test_stop_sees_the_model_right_after_its_step():
    """With a ``stop`` callback every step is read back before the next, whatever
    ``sync_every``: the callback sees the weights of exactly the steps done."""
    seen = {}
    for every in (1, 5):
        model, generator = _model(), torch.Generator().manual_seed(6)
        weights = []
        fit(model, batch_source(_loader("zero", generator)), make_intervention("zero"), generator, steps=6,
            batch_size=4, device="cpu", sync_every=every,
            stop=lambda done: weights.append(model.head.weight.detach().clone()) or False)
        seen[every] = weights
    assert len(seen[1]) == len(seen[5]) == 6
    assert all(torch.equal(a, b) for a, b in zip(seen[1], seen[5]))
