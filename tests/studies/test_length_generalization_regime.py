"""Paper B's regime in length-generalization: checkpoints inside one training run (budget),
post-training arms against a zero-state control (interventions), the in-range and far PPL,
and the presets that map the PPL rise (budget, context, interventions)."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import xarray as xr

from dynlab.lm.analysis.metrics import binned_ppl, length_generalization, ppl_ranges
from dynlab.lm.train.interventions import make_intervention
from dynlab.lm.run.text import (
    build_model, checkpoint_steps, corpus_for, count_parameters, evaluate_model, train_and_evaluate,
)
from dynlab.lm.spec import CHINCHILLA_TOKENS_PER_PARAM, LMEvalSpec, LMModelSpec, LMPostSpec, LMRunSpec, LMTrainSpec
from dynlab.lm.train.engine import train_lm
from dynlab.runner.driver import open_study, run_study
from dynlab.studies.length_generalization import PRESETS, STUDY, make_specs, steps_for_budget
from dynlab.runner.protocol import StudyOptions

MODEL = {"d_model": 8, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8, "mlp_ratio": 0}
EVAL = {"length_multiple": 4, "n_samples": 3, "chunk_len": 16, "bin_width": 4, "effrem_points": 2,
        "effrem_samples": 2, "state_points": 4}


def _spec(**kw) -> LMRunSpec:
    fields = {"model": LMModelSpec(**MODEL), "train": LMTrainSpec(steps=6, batch_size=2, seq_len=8, threads=1),
              "eval": LMEvalSpec(**EVAL)}
    return LMRunSpec(**{**fields, **kw})


def test_checkpoint_steps_are_the_chinchilla_multiples():
    """c × 20 tokens per parameter at B·L tokens a step: P = 1000, 100 tokens a step → 200 steps per 1×."""
    assert CHINCHILLA_TOKENS_PER_PARAM == 20
    assert checkpoint_steps(1000, (0.5, 1.0, 4.0), 10, 10, 10_000) == [100, 200, 800]
    assert checkpoint_steps(1000, (0.001, 100.0), 10, 10, 5000) == [1, 5000]  # clipped to [1, steps]
    spec = _spec()
    model = build_model(spec)
    n = count_parameters(model)
    assert n == sum(p.numel() for p in model.parameters()) and n > 2 * 256 * MODEL["d_model"]  # embedding + head
    assert steps_for_budget(spec.model, 2.0, 4, 8) == -(-2 * 20 * n // 32)


def test_a_checkpoint_is_the_model_of_that_step_and_the_last_is_the_trained_model():
    """The evaluation at a checkpoint equals that of the same run stopped at that step (same
    batches and schedule), and the checkpoint at the run's end is the run's own evaluation."""
    spec = _spec(eval=LMEvalSpec(**EVAL, checkpoints=(0.0005, 1000.0)))
    n = count_parameters(build_model(spec))
    early = checkpoint_steps(n, (0.0005,), 2, 8, 6)[0]
    assert 1 <= early < 6
    result, _ = train_and_evaluate(spec)
    first, last = result["checkpoints"]
    assert (first["budget"], first["step"], first["tokens"]) == (0.0005, early, early * 16)
    assert last["step"] == 6 and last["ppl"] == result["ppl"]
    corpus = corpus_for(spec.data.source, spec.data.val_fraction)
    model = build_model(spec)
    tr = spec.train
    train_lm(model, corpus.train, make_intervention("zero"), steps=tr.steps, batch_size=tr.batch_size,
             seq_len=tr.seq_len, lr=tr.lr, weight_decay=tr.weight_decay, grad_clip=tr.clip,
             warmup_frac=tr.warmup_frac, seed=spec.seed, threads=1, stop=lambda done: done >= early)
    # equal up to float32 rounding: the run evaluates on its one training thread, this call on
    # the process's threads, which may sum in another order
    np.testing.assert_allclose(first["ppl"], evaluate_model(model.eval(), spec, corpus)["ppl"], rtol=1e-5, atol=0)
    assert not np.array_equal(first["ppl"], last["ppl"])


def test_every_arm_reads_the_same_batches_from_the_same_trained_weights():
    """Random noise of σ = 0 is the zero state: its arm must equal the control exactly, which
    holds only if both start from the trained weights and read the same batches (the noise
    comes from its own generator). State passing differs; the trained model is kept."""
    spec = _spec(intervention={"kind": "zero", "sigma": 0.0},
                 post=LMPostSpec(interventions=("random-noise", "state-passing"), steps=3, lr=1e-3))
    assert spec.post.interventions == ("zero", "random-noise", "state-passing")  # the control is always there
    result, weights = train_and_evaluate(spec)
    arms = result["post"]
    assert set(arms) == {"zero", "random-noise", "state-passing"} and all(a["status"] == "ok" for a in arms.values())
    assert arms["random-noise"]["ppl"] == arms["zero"]["ppl"]
    assert arms["state-passing"]["ppl"] != arms["zero"]["ppl"] and arms["zero"]["ppl"] != result["ppl"]
    for name, value in weights.items():
        if name.startswith("post.random-noise."):
            torch.testing.assert_close(value, weights[name.replace("random-noise", "zero")], rtol=0, atol=0)
    # the trained weights are the run's own, not an arm's
    trained = {k: v for k, v in weights.items() if not k.startswith("post.")}
    assert any(not torch.equal(trained[k], weights[f"post.zero.{k}"]) for k in trained)


def test_ppl_ranges_of_a_known_curve():
    """Bins of 4 tokens on t = 1..64, T_train 16: in = the bin ending at 12 and 16; far = the bins in (56, 64]."""
    nll = np.log(np.tile(np.linspace(2.0, 9.0, 64), (3, 1)))  # PPL(t) rises linearly from 2 to 9
    binned = binned_ppl(nll, 4)
    verdict = length_generalization(binned, 16)
    got = ppl_ranges(binned, verdict.p_star, 16)
    t = binned["t_bin"].values
    b = binned.values
    assert got["ppl_in"] == pytest.approx(b[(t > 8) & (t <= 16)].mean())
    assert got["ppl_far"] == pytest.approx(b[t > 56].mean())
    assert got["far_in_ratio"] == pytest.approx(b[t > 56].mean() / verdict.p_star)
    assert float(got["far_in_ratio"]) > 1 and got["ppl_in"].attrs["long_name"] == "in-range perplexity"
    flat = binned_ppl(np.zeros((2, 64)), 4)
    assert float(ppl_ranges(flat, 1.0, 16)["far_in_ratio"]) == pytest.approx(1.0)


def test_presets_are_what_their_docs_say():
    budget = make_specs(StudyOptions(preset="budget"))
    assert [s.seed for s in budget] == [0, 1, 2] and {s.intervention.kind for s in budget} == {"zero"}
    spec = budget[0]
    n = count_parameters(build_model(spec))
    tokens = spec.train.steps * spec.train.batch_size * spec.train.seq_len
    assert 32 <= tokens / (20 * n) < 32 + spec.train.batch_size * spec.train.seq_len / (20 * n)
    assert spec.eval.checkpoints == (0.5, 1.0, 2.0, 4.0, 8.0, 16.0, 32.0) and spec.eval_length == 16 * 32
    context = make_specs(StudyOptions(preset="context"))
    assert sorted({s.train.seq_len for s in context}) == [16, 32, 64, 128] and len({s.model for s in context}) == 2
    assert {s.train.steps * s.train.batch_size * s.train.seq_len for s in context} == {PRESETS["context"]["tokens"]}
    iv = make_specs(StudyOptions(preset="interventions"))
    quick_model = make_specs(StudyOptions(preset="quick"))[0].model
    assert len(iv) == 5 and all(s.model == quick_model and s.post is not None for s in iv)
    assert not {s.seed for s in iv} & {0, 1, 2}  # the seeds that showed the quick model rises chose it
    assert iv[0].post.interventions == ("zero", "random-noise", "fitted-noise", "state-passing", "tbtt")
    quick = make_specs(StudyOptions(preset="quick"))
    assert all(s.post is None and "post" not in s.hashed_fields() and "checkpoints" not in s.hashed_fields()["eval"]
               for s in quick)  # runs without the new fields keep the run ids they had
    with pytest.raises(ValueError, match="has no post-training arms"):
        make_specs(StudyOptions(preset="quick", extra={"post": {"steps": 3}}))
    with pytest.raises(ValueError, match="checkpoints"):
        LMEvalSpec(checkpoints=(0.0,))


@pytest.mark.slow
def test_budget_and_intervention_datasets_end_to_end(tmp_path):
    """A tiny budget study has the dim budget and first_rise_budget; a tiny interventions study
    has one row per tested model and PPL contrasts equal to the paired differences."""
    tiny = {"model": {k: v for k, v in MODEL.items() if k != "mlp_ratio"}, "eval": EVAL}
    b = open_study(run_study(STUDY, StudyOptions(preset="budget", seeds=(0, 1), extra={
        **tiny, "train": {"batch_size": 2, "seq_len": 8, "steps": 5}, "eval": {**EVAL, "checkpoints": (0.0001, 1e6)}}),
        out=tmp_path / "b", device="cpu"))
    assert b["far_in_ratio"].dims == ("run", "budget") and list(b["budget"].values) == [0.0001, 1e6]
    assert list(b["checkpoint_step"].isel(run=0).values) == [1, 5]
    ratio = b["far_in_ratio"].values
    for r in range(2):
        above = np.flatnonzero(ratio[r] > 1)
        want = b["budget"].values[above[0]] if above.size else np.nan
        np.testing.assert_equal(float(b["first_rise_budget"].values[r]), want)
    iv = open_study(run_study(STUDY, StudyOptions(preset="interventions", seeds=(0, 1), extra={
        **tiny, "train": {"batch_size": 2, "seq_len": 8, "steps": 4}, "post": {"steps": 2,
                                                                               "interventions": ["state-passing"]}}),
        out=tmp_path / "i", device="cpu"))
    phase, ivs = iv["phase"].values.astype(str), iv["intervention"].values.astype(str)
    assert list(phase) == ["base", "post", "post"] * 2 and list(ivs) == ["zero", "zero", "state-passing"] * 2
    far = iv["ppl_far"].values
    diffs = [far[(iv["seed"].values == s) & (ivs == "state-passing") & (phase == "post")][0]
             - far[(iv["seed"].values == s) & (ivs == "zero") & (phase == "post")][0] for s in (0, 1)]
    assert float(iv["far_contrast_mean"].sel(contrast="state-passing").isel(mixer=0)) == pytest.approx(np.mean(diffs))
    assert int(iv["far_contrast_n"].sel(contrast="state-passing").isel(mixer=0)) == 2
    assert isinstance(iv, xr.Dataset) and "in_contrast_p" in iv


def test_post_training_arms_are_judged_as_warm_starts():
    """A post-training arm starts from the trained model: at a learning rate of 1e-9 its loss
    cannot fall, only stay level, which the warm-start rule calls converged and the
    cold-start rule does not (dynlab.training.converged)."""
    from dynlab.training import converged

    spec = _spec(post=LMPostSpec(interventions=("state-passing",), steps=40, lr=1e-9))
    result, _ = train_and_evaluate(spec)
    for name, arm in result["post"].items():
        assert arm["status"] == "ok" and arm["train_steps"] == 40, name
        assert arm["converged"] is True, name
        curve = np.asarray(arm["loss_curve"])
        assert np.ptp(curve) < 0.05 * curve.mean(), name  # level: no fall for the cold rule to see
        assert not converged(list(curve)), name
