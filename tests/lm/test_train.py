"""LM training on the engine's schedule, threads and divergence rule."""

from __future__ import annotations

import json
import math

import pytest
import torch

from dynlab.lm.train.interventions import RandomNoise, ZeroInit
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.train.engine import train_lm, train_summary

DATA = torch.randint(0, 256, (3000,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)


def _model() -> RecurrentLM:
    return RecurrentLM("mamba2", d_model=16, n_layers=1, n_heads=2, head_dim=4, d_state=4,
                       generator=torch.Generator().manual_seed(1))


def _train(model=None, intervention=None, **kw):
    args = {"steps": 6, "batch_size": 2, "seq_len": 8, "device": "cpu"} | kw
    return train_lm(model or _model(), DATA, intervention or ZeroInit(), **args)


@pytest.mark.parametrize("steps, warmup_frac, warmup", [(20, 0.1, 2), (12, 0.0, 1)])
def test_lm_schedule_warms_up_then_decays_to_a_tenth(monkeypatch, steps, warmup_frac, warmup):
    """The rate of every step, recorded at the optimiser, against the formula: linear
    warm-up over round(warmup_frac·steps) steps (at least one), cosine to 0.1·lr at the end."""
    used = []
    step = torch.optim.AdamW.step

    def recording_step(self, *a, **k):
        used.append([g["lr"] for g in self.param_groups])
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    res = _train(steps=steps, lr=0.02, warmup_frac=warmup_frac)
    assert res.status == "ok" and len(res.losses) == steps and res.lengths == [8] * steps
    lr = 0.02
    expect = [lr * (s + 1) / warmup if s < warmup
              else lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * (s - warmup) / (steps - warmup))))
              for s in range(steps)]
    for s, (decay, no_decay) in enumerate(used):  # both parameter groups follow the schedule
        assert decay == pytest.approx(expect[s], rel=1e-12, abs=1e-12) and no_decay == decay, s


def test_lm_training_runs_on_the_engines_thread_count():
    seen = []
    old = torch.get_num_threads()
    _train(steps=2, progress=lambda step, loss: seen.append(torch.get_num_threads()))
    _train(steps=2, threads=2, progress=lambda step, loss: seen.append(torch.get_num_threads()))
    assert seen == [1, 1, 2, 2]  # RUN_THREADS unless told; the caller's count is restored
    assert torch.get_num_threads() == old
    with pytest.raises(ValueError, match="threads must be an integer"):
        _train(steps=1, threads=0)


def test_absurd_learning_rate_stops_the_run_as_diverged():
    res = _train(steps=30, lr=1e30, warmup_frac=0.0)
    assert res.status == "diverged" and res.reason.startswith("non-finite ")
    assert "(length 8)" in res.reason
    assert 0 < len(res.losses) < 30 and all(math.isfinite(x) for x in res.losses)
    summary = train_summary(res)
    assert summary["status"] == "diverged" and summary["reason"] == res.reason
    assert summary["train_steps"] == len(res.losses) and math.isfinite(summary["train_loss"])


class _NaNNoise(RandomNoise):
    """Random-noise initial states with a NaN from the third step on."""

    calls = 0

    def initial_states(self, batch_size, shapes, fresh, generator):
        out = super().initial_states(batch_size, shapes, fresh, generator)
        _NaNNoise.calls += 1
        if _NaNNoise.calls >= 3:
            out[0].view(-1)[0] = float("nan")
        return out


def test_nan_stops_the_run_before_the_update():
    """The failing step is neither applied nor recorded: the parameters are those after step 1."""
    _NaNNoise.calls = 0
    model = _model()
    res = _train(model, _NaNNoise(sigma=0.1), steps=5)
    assert res.status == "diverged" and res.reason == "non-finite loss at step 2 (length 8)"
    assert len(res.losses) == 2 and res.model is model
    twin = _model()
    _train(twin, RandomNoise(sigma=0.1), steps=2)  # same batches and noise for steps 0 and 1
    for (name, a), (_, b) in zip(model.named_parameters(), twin.named_parameters()):
        assert torch.all(torch.isfinite(a)), name
        torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)


def test_diverging_lm_run_is_failed_and_the_study_goes_on(tmp_path, monkeypatch):
    """length-generalization with two interventions, one injecting a NaN: that run is stored
    as diverged without weights, the other is trained and evaluated, the study completes."""
    from dynlab.runner.driver import run_study
    from dynlab.studies.length_generalization import STUDY
    from dynlab.runner.protocol import StudyOptions

    def nan_states(self, batch_size, shapes, fresh, generator):
        return [torch.full((batch_size, *s), float("nan")) for s in shapes]

    monkeypatch.setattr(RandomNoise, "initial_states", nan_states)
    tiny = {
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
        "train": {"steps": 3, "batch_size": 2, "seq_len": 16},
        "eval": {"length_multiple": 4, "n_samples": 2, "chunk_len": 16, "bin_width": 8, "effrem_points": 3,
                 "effrem_samples": 2},
        "interventions": ["zero", "random-noise"],
    }
    path = run_study(STUDY, StudyOptions(preset="quick", extra=tiny), out=tmp_path, device="cpu")
    results = {}
    for run in (path.parent / "runs").iterdir():
        result = json.loads((run / "result.json").read_text())
        results[result.get("intervention") or run.name] = (result, (run / "model.safetensors").exists())
    statuses = sorted((r["status"], r["reason"], has_weights) for r, has_weights in results.values())
    assert statuses == [("diverged", "non-finite loss at step 0 (length 16)", False), ("ok", "", True)]
