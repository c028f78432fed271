"""The LM ensemble engine: every member equals the same model trained alone.

Tolerances: the forward in float64 to 1e-11 relative (only the reduction order of the
batched GEMMs differs); training in float64 for a few steps to 1e-9 (AdamW divides by
sqrt of tiny second moments at its first step, which amplifies rounding); float32 training
to 2e-4 relative on the parameters after 4 steps.
"""

from __future__ import annotations

import math

import numpy as np

import pytest
import torch

from dynlab.errors import DynlabInputError
from dynlab.lm.train.ensemble import fit_ensemble
from dynlab.lm.train.stack import LMStack
from dynlab.lm.train.interventions import make_intervention
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.models.states import CarriedStates
from dynlab.lm.train.engine import fit, make_loader

KW = {
    "mamba2": {"n_heads": 2, "head_dim": 8, "d_state": 8, "chunk_size": 8},
    "mamba1": {"d_inner": 16, "d_state": 8, "n_heads": 2, "chunk_size": 8},
    "gla": {"n_heads": 2, "key_dim": 8, "value_dim": 8, "chunk_size": 8},
}


def _model(mixer: str, seed: int, dtype=torch.float64, mlp_ratio: int = 2, **extra) -> RecurrentLM:
    m = RecurrentLM(mixer, d_model=16, n_layers=2, mlp_ratio=mlp_ratio, generator=torch.Generator().manual_seed(seed),
                    **{**KW[mixer], **extra})
    return m.to(dtype)


def _text(n: int = 4000, seed: int = 0) -> torch.Tensor:
    # a byte stream with structure (a repeated phrase with noise), so training moves the loss
    g = torch.Generator().manual_seed(seed)
    base = torch.tensor(list(b"to be or not to be, that is the question. "), dtype=torch.long)
    text = base.repeat(n // len(base) + 1)[:n].clone()
    flip = torch.rand(n, generator=g) < 0.05
    text[flip] = torch.randint(0, 256, (int(flip.sum()),), generator=g)
    return text


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach(), b.detach()
    return float((a - b).abs().max() / b.abs().max().clamp(min=1e-30))


def _streams(arms, seeds, data, batch: int = 4, seq_len: int = 16):
    """Each member's batch source, intervention and generator, as ``fit`` would get them alone."""
    sources, ivs, gens = [], [], []
    for arm, seed in zip(arms, seeds):
        gen = torch.Generator().manual_seed(seed)
        iv = make_intervention(arm, sigma=0.3)
        loader = make_loader(iv, data, batch, seq_len, gen)
        sources.append(lambda ld=loader: (lambda b: (b.tokens, None, b.fresh))(next(ld)))
        ivs.append(iv)
        gens.append(gen)
    return sources, ivs, gens


@pytest.mark.parametrize("mixer", sorted(KW))
@pytest.mark.parametrize("impl", ["dispatch", "ref"])
def test_forward_equals_each_model(mixer, impl):
    models = [_model(mixer, seed, impl=impl) for seed in (0, 1, 2)]
    stack = LMStack(models)
    g = torch.Generator().manual_seed(5)
    tokens = torch.randint(0, 256, (3, 2, 20), generator=g)
    shapes = models[0].state_shapes()
    states = [torch.randn(3, 2, *s, generator=g, dtype=torch.float64) for s in shapes]
    windows = [torch.randn(3, 2, *c, generator=g, dtype=torch.float64) for c in models[0].conv_shapes()]
    logits, finals, new_windows = stack.forward(tokens, states, windows)
    for e, model in enumerate(models):
        init = CarriedStates([s[e] for s in states], [w[e] for w in windows])
        ref_logits, ref_finals = model(tokens[e], init)
        assert _rel(logits[e], ref_logits) < 1e-11
        for layer in range(2):
            assert _rel(finals[layer][e], ref_finals[layer]) < 1e-11
            assert _rel(new_windows[layer][e], ref_finals.conv[layer]) < 1e-11


def test_forward_gradients_equal_each_model():
    """The backward through the stack gives each member its own model's gradient."""
    models = [_model("mamba2", seed) for seed in (3, 4)]
    stack = LMStack(models)
    tokens = torch.randint(0, 256, (2, 2, 17), generator=torch.Generator().manual_seed(1))
    logits, _, _ = stack.forward(tokens)
    (logits.square().mean(dim=(1, 2, 3))).sum().backward()
    for e, model in enumerate(models):
        ref, _ = model(tokens[e])
        ref.square().mean().backward()
        want = torch.cat([p.grad.reshape(-1) for p in model.parameters()])
        assert _rel(stack.flat.grad[e], want) < 1e-10


def _solo_and_stack(mixer: str, arms: list[str], seeds: list[int], steps: int, dtype, **model_kw):
    data = _text()
    batch, seq_len = 4, 16
    kw = dict(steps=steps, batch_size=batch, lr=3e-3, weight_decay=0.1, grad_clip=0.5, warmup_frac=0.25)
    solo = []
    for arm, seed in zip(arms, seeds):  # each model alone, with fresh streams of its own
        (source,), (iv,), (gen,) = _streams([arm], [seed], data, batch, seq_len)
        solo.append(fit(_model(mixer, seed, dtype, **model_kw), source, iv, gen, **kw))
    models = [_model(mixer, seed, dtype, **model_kw) for seed in seeds]
    ens = fit_ensemble(models, *_streams(arms, seeds, data, batch, seq_len), sync_every=2, **kw)
    return solo, ens


@pytest.mark.parametrize("mixer", sorted(KW))
def test_training_equals_solo_float64(mixer):
    """Every arm, each member trained in the stack equals the same model trained by ``fit``."""
    arms = ["zero", "random-noise", "fitted-noise", "state-passing", "tbtt"]
    solo, ens = _solo_and_stack(mixer, arms, list(range(len(arms))), steps=5, dtype=torch.float64)
    for s, e in zip(solo, ens):
        assert e.status == s.status == "ok"
        assert len(e.losses) == len(s.losses) == 5
        assert max(abs(a - b) for a, b in zip(e.losses, s.losses)) < 1e-9
        for p, q in zip(e.model.parameters(), s.model.parameters()):
            assert _rel(p.detach(), q.detach()) < 1e-9


def test_training_equals_solo_float32():
    solo, ens = _solo_and_stack("mamba2", ["zero", "state-passing"], [7, 8], steps=4, dtype=torch.float32)
    for s, e in zip(solo, ens):
        assert max(abs(a - b) for a, b in zip(e.losses, s.losses)) < 1e-4
        for p, q in zip(e.model.parameters(), s.model.parameters()):
            assert _rel(p.detach(), q.detach()) < 2e-4


def test_a_member_never_changes_another():
    """Adding members leaves a member's trajectory unchanged (own generator, own batches)."""
    _, alone = _solo_and_stack("gla", ["random-noise"], [3], steps=4, dtype=torch.float64)
    _, together = _solo_and_stack("gla", ["zero", "random-noise", "tbtt"], [1, 3, 9], steps=4, dtype=torch.float64)
    assert max(abs(a - b) for a, b in zip(alone[0].losses, together[1].losses)) < 1e-12


@pytest.mark.parametrize("mixer", sorted(KW))
def test_divergence_is_per_member(mixer):
    """A member whose loss becomes non-finite stops there, as ``fit`` reports it; the others
    train on, as alone (GLA's chunking, which reads every head's gates, included)."""
    data = _text()
    models = [_model(mixer, s, torch.float64) for s in (0, 1)]
    with torch.no_grad():
        models[1].head.weight.fill_(math.inf)
        for name, p in models[1].named_parameters():
            if name.endswith(("in_proj.weight", "qkvg_proj.weight")):
                p.fill_(math.nan)  # NaN inside the scans too
    before = [p.detach().clone() for p in models[1].parameters()]
    sources, ivs, gens = _streams(["zero", "zero"], [0, 1], data)
    res = fit_ensemble(models, sources, ivs, gens, steps=6, batch_size=4, sync_every=3)
    assert res[0].status == "ok" and len(res[0].losses) == 6 and all(math.isfinite(v) for v in res[0].losses)
    assert res[1].status == "diverged" and res[1].reason == "non-finite loss at step 0 (length 16)"
    assert res[1].losses == []
    for p, q in zip(models[1].parameters(), before):  # frozen before its failing step
        assert torch.equal(torch.nan_to_num(p.detach()), torch.nan_to_num(q))  # exactly, NaN and inf included
    # the healthy member equals its own solo run
    solo = _model(mixer, 0, torch.float64)
    gen = torch.Generator().manual_seed(0)
    iv = make_intervention("zero")
    loader = make_loader(iv, data, 4, 16, gen)
    ref = fit(solo, lambda: (lambda b: (b.tokens, None, b.fresh))(next(loader)), iv, gen, steps=6, batch_size=4)
    assert max(abs(a - b) for a, b in zip(res[0].losses, ref.losses)) < 1e-9


def test_masked_task_batches_equal_solo():
    """Task batches with a target mask (the task studies' loss) train as with ``fit``."""
    g = torch.Generator().manual_seed(0)
    batches = [(torch.randint(0, 256, (4, 13), generator=g), torch.rand(4, 12, generator=g) < 0.3,
                torch.ones(4, dtype=torch.bool)) for _ in range(3)]
    solo = _model("mamba1", 2)
    it = iter(batches)
    ref = fit(solo, lambda: next(it), make_intervention("zero"), torch.Generator(), steps=3, batch_size=4)
    models = [_model("mamba1", 2), _model("mamba1", 5)]
    its = [iter(batches), iter(batches)]
    res = fit_ensemble(models, [lambda: next(its[0]), lambda: next(its[1])],
                       [make_intervention("zero"), make_intervention("zero")], [torch.Generator(), torch.Generator()],
                       steps=3, batch_size=4)
    assert max(abs(a - b) for a, b in zip(res[0].losses, ref.losses)) < 1e-9
    for p, q in zip(models[0].parameters(), solo.parameters()):
        assert _rel(p.detach(), q.detach()) < 1e-9


def test_checkpoints_see_the_weights_of_that_step():
    data = _text()
    models = [_model("mamba2", 0)]
    gen = torch.Generator().manual_seed(0)
    iv = make_intervention("zero")
    loader = make_loader(iv, data, 4, 16, gen)
    seen = {}
    fit_ensemble(models, [lambda: (lambda b: (b.tokens, None, b.fresh))(next(loader))], [iv], [gen], steps=4,
                 batch_size=4, checkpoints=[2], on_checkpoint=lambda done, alive: seen.update({done: models[0].head.weight.detach().clone()}))
    solo = _model("mamba2", 0)
    gen = torch.Generator().manual_seed(0)
    loader = make_loader(iv, data, 4, 16, gen)
    fit(solo, lambda: (lambda b: (b.tokens, None, b.fresh))(next(loader)), make_intervention("zero"), gen, steps=4,
        batch_size=4, stop=lambda done: done == 2)
    assert list(seen) == [2]
    assert _rel(seen[2], solo.head.weight.detach()) < 1e-9


def test_models_of_different_layouts_are_refused():
    with pytest.raises(DynlabInputError, match="differs in layout"):
        LMStack([_model("mamba2", 0), _model("mamba2", 0, mlp_ratio=0)])
    with pytest.raises(DynlabInputError, match="differs in layout"):
        LMStack([_model("gla", 0), _model("gla", 0, chunk_size=4)])


def test_study_stack_engine_equals_loop_and_is_one_work_item(tmp_path):
    """``train.engine = "stack"``: the study trains the 5 arms x 2 seeds as one work item;
    each run's result equals its ``loop`` twin to float32 rounding of a short training."""
    from dynlab.runner.driver import open_study, run_study
    from dynlab.studies.length_generalization import STUDY, make_specs
    from dynlab.runner.protocol import StudyOptions

    tiny = {
        "model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
        "train": {"steps": 3, "batch_size": 2, "seq_len": 16},
        "eval": {"length_multiple": 4, "n_samples": 3, "chunk_len": 16, "bin_width": 8, "effrem_points": 3,
                 "effrem_samples": 2, "checkpoints": [0.0001, 1]},
    }
    stacked = {**tiny, "train": {**tiny["train"], "engine": "stack"}}
    specs = make_specs(StudyOptions(preset="quick", seeds=(0, 1), extra=stacked))
    assert len(STUDY.work_items(specs)) == 1 and len(specs) == 10
    loop_specs = make_specs(StudyOptions(preset="quick", seeds=(0, 1), extra=tiny))
    assert {s.spec_hash() for s in loop_specs}.isdisjoint({s.spec_hash() for s in specs})
    assert "engine" not in loop_specs[0].model_dump_json() or loop_specs[0].train.engine == "loop"
    a = open_study(run_study(STUDY, StudyOptions(preset="quick", seeds=(0, 1), extra=stacked), out=tmp_path / "s", device="cpu"))
    b = open_study(run_study(STUDY, StudyOptions(preset="quick", seeds=(0, 1), extra=tiny), out=tmp_path / "l", device="cpu"))
    assert (a["ensemble_size"] == 10).all()
    assert list(a["intervention"].values) == list(b["intervention"].values)
    np.testing.assert_allclose(a["train_loss"], b["train_loss"], rtol=1e-5, atol=0)
    np.testing.assert_allclose(a["ppl"].sel(t=slice(1, None)), b["ppl"].sel(t=slice(1, None)), rtol=1e-4, atol=0)
    assert a["budget"].size == 2 and np.isfinite(a["far_in_ratio"]).all()


@pytest.mark.parametrize("arm", ["fitted-noise", "state-passing", "tbtt"])
def test_a_stack_cut_off_resumes_where_it_stopped(tmp_path, arm):
    """Stopped after 3 of 6 steps (the state saved at every step), a second call continues
    from step 3 and ends exactly where an uninterrupted run ends."""
    data = _text()

    def setup():
        models = [_model("mamba2", s) for s in (0, 1)]
        srcs, ivs, gens, loaders = [], [], [], []
        for s in (0, 1):
            gen = torch.Generator().manual_seed(s)
            iv = make_intervention(arm, sigma=0.3)
            loader = make_loader(iv, data, 4, 16, gen)
            loaders.append(loader)
            srcs.append(lambda ld=loader: (lambda b: (b.tokens, None, b.fresh))(next(ld)))
            ivs.append(iv)
            gens.append(gen)
        return models, srcs, ivs, gens, loaders

    kw = dict(steps=6, batch_size=4, sync_every=1)
    whole = fit_ensemble(*setup()[:4], **kw)
    path = tmp_path / "state.pt"

    class Cut(Exception):
        pass

    def cut(done, losses):
        if done == 3:
            raise Cut

    models, srcs, ivs, gens, loaders = setup()
    with pytest.raises(Cut):
        fit_ensemble(models, srcs, ivs, gens, resume=path, save_every_s=0.0, progress=cut,
                     save_extra=lambda: {"note": "x"}, **kw)
    assert path.exists()
    models, srcs, ivs, gens, loaders = setup()
    seen = {}

    def on_resume(done, extra):
        seen.update(done=done, extra=extra)
        for ld in loaders:
            if hasattr(ld, "step"):
                ld.step = done

    resumed = fit_ensemble(models, srcs, ivs, gens, resume=path, on_resume=on_resume, **kw)
    assert seen == {"done": 2, "extra": {"note": "x"}}  # the cut came before the save of step 3
    assert not path.exists()
    for a, b in zip(whole, resumed):
        assert a.losses == b.losses
        for p, q in zip(a.model.parameters(), b.model.parameters()):
            assert torch.equal(p, q)


def test_a_broken_resume_file_is_one_line(tmp_path):
    path = tmp_path / "state.pt"
    path.write_bytes(b"not a torch file")
    gen = torch.Generator().manual_seed(0)
    iv = make_intervention("zero")
    loader = make_loader(iv, _text(), 4, 16, gen)
    with pytest.raises(DynlabInputError, match="cannot resume from .*state.pt.*delete it"):
        fit_ensemble([_model("mamba2", 0)], [lambda: (lambda b: (b.tokens, None, b.fresh))(next(loader))], [iv], [gen],
                     steps=2, batch_size=4, resume=path)


def test_a_resume_file_of_another_run_is_refused_and_kept(tmp_path):
    """A state saved by one run is refused, with what differs, by a call with other
    starting weights (another seed), another intervention or other settings (fewer steps,
    whose schedule differs), and the file is left as it was."""
    data = _text()
    path = tmp_path / "state.pt"

    def call(seed=0, arm="zero", steps=6, **kw):
        gen = torch.Generator().manual_seed(seed)
        iv = make_intervention(arm, sigma=0.3)
        loader = make_loader(iv, data, 4, 16, gen)
        return fit_ensemble([_model("mamba2", seed)], [lambda: (lambda b: (b.tokens, None, b.fresh))(next(loader))],
                            [iv], [gen], steps=steps, batch_size=4, resume=path, sync_every=1, **kw)

    class Cut(Exception):
        pass

    def cut(done, losses):
        if done == 3:
            raise Cut

    with pytest.raises(Cut):
        call(save_every_s=0.0, progress=cut)
    saved = path.read_bytes()
    for kw, what in (({"seed": 7}, "start_params"), ({"arm": "random-noise"}, "interventions"), ({"steps": 3}, "steps")):
        with pytest.raises(DynlabInputError, match=f"cannot resume from .*saved by another run: .*{what}"):
            call(**kw)
        assert path.read_bytes() == saved
    assert call()[0].status == "ok" and not path.exists()  # the run that saved it resumes


def test_members_with_batches_of_other_shapes_are_one_clear_error():
    data = _text()
    srcs, ivs, gens = [], [], []
    for seed, seq_len in ((0, 16), (1, 12)):
        gen = torch.Generator().manual_seed(seed)
        iv = make_intervention("zero")
        loader = make_loader(iv, data, 4, seq_len, gen)
        srcs.append(lambda ld=loader: (lambda b: (b.tokens, None, b.fresh))(next(ld)))
        ivs.append(iv)
        gens.append(gen)
    with pytest.raises(DynlabInputError, match=r"batches differ in shape .*\(4, 17\), \(4, 13\)"):
        fit_ensemble([_model("mamba2", s) for s in (0, 1)], srcs, ivs, gens, steps=2, batch_size=4)


def test_a_trained_model_stacks_with_a_fresh_one():
    """train/eval mode is not a layout: a model left in eval mode (as fit leaves it) stacks
    with a fresh one of the same spec, and the stack's forward equals each model's."""
    a, b = _model("gla", 0), _model("gla", 1)
    a.eval()
    stack = LMStack([a, b])
    tokens = torch.randint(0, 256, (2, 3, 9), generator=torch.Generator().manual_seed(0))
    logits, _, _ = stack.forward(tokens)
    for i, m in enumerate((a, b)):
        torch.testing.assert_close(logits[i], m(tokens[i])[0], rtol=1e-10, atol=1e-10)


def test_runs_cut_off_resume_with_their_checkpoint_evaluations(tmp_path, monkeypatch):
    """train_and_evaluate_many stopped after 3 of 5 steps continues from its saved state and
    gives the results of the uninterrupted stack, the evaluation at the budget passed included."""
    import dynlab.lm.run.text as run
    from dynlab.studies.length_generalization import make_specs
    from dynlab.runner.protocol import StudyOptions

    tiny = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
            "train": {"steps": 5, "batch_size": 2, "seq_len": 16, "engine": "stack"},
            "eval": {"length_multiple": 4, "n_samples": 3, "chunk_len": 16, "bin_width": 8, "effrem_points": 3,
                     "effrem_samples": 2}, "interventions": ["zero", "tbtt"]}
    specs = make_specs(StudyOptions(preset="quick", seeds=(0,), extra=tiny))
    n = run.count_parameters(run.build_model(specs[0]))
    specs = [s.model_copy(update={"eval": s.eval.model_copy(update={"checkpoints": (2 * 2 * 16 / (20 * n),)})})
             for s in specs]  # a budget reached after 2 steps
    assert run.checkpoint_steps(n, specs[0].eval.checkpoints, 2, 16, 5) == [2]
    whole = run.train_and_evaluate_many(specs, "cpu", sync_every=1)
    monkeypatch.setattr(run, "SAVE_EVERY_S", 0.0)

    def cut(done, losses):
        if done == 4:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run.train_and_evaluate_many(specs, "cpu", cut, sync_every=1, resume_dir=tmp_path / "resume")
    assert len(list((tmp_path / "resume").iterdir())) == 1
    again = run.train_and_evaluate_many(specs, "cpu", sync_every=1, resume_dir=tmp_path / "resume")
    assert not (tmp_path / "resume").exists()
    for (a, wa), (b, wb) in zip(whole, again):
        assert a["train_loss"] == b["train_loss"] and a["ppl"] == b["ppl"]
        assert a["checkpoints"] == b["checkpoints"]
        assert all(torch.equal(wa[k], wb[k]) for k in wa)


@pytest.mark.slow
def test_compiled_stack_equals_eager():
    """``compile=True`` (torch.compile of the step's forward and loss) trains as eager, to float32 rounding."""
    data = _text()

    def run(compile_):
        models = [_model("mamba2", s, torch.float32) for s in (0, 1)]
        srcs, ivs, gens = _streams(["state-passing"] * 2, [0, 1], data)
        return fit_ensemble(models, srcs, ivs, gens, steps=3, batch_size=4, compile=compile_)

    eager, compiled = run(False), run(True)
    for a, b in zip(eager, compiled):
        assert max(abs(x - y) for x, y in zip(a.losses, b.losses)) < 1e-4
        for p, q in zip(a.model.parameters(), b.model.parameters()):
            assert _rel(p.detach(), q.detach()) < 1e-3


def test_a_study_with_a_stack_state_in_resume_is_dynlabs_own(tmp_path):
    """The study folder's contract accepts resume/, where a stack cut off leaves its state."""
    from dynlab.results.folder import check_study_folder
    from dynlab.runner.driver import run_study
    from dynlab.studies.length_generalization import STUDY
    from dynlab.runner.protocol import StudyOptions

    tiny = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
            "train": {"steps": 3, "batch_size": 2, "seq_len": 16, "engine": "stack"},
            "eval": {"length_multiple": 4, "n_samples": 3, "chunk_len": 16, "bin_width": 8, "effrem_points": 3,
                     "effrem_samples": 2}, "interventions": ["zero"]}
    options = StudyOptions(preset="quick", seeds=(0, 1), extra=tiny)
    path = run_study(STUDY, options, out=tmp_path, device="cpu")
    study = path.parent
    (study / "resume").mkdir()
    (study / "resume" / "stack-0123456789abcdef.pt").write_bytes(b"")
    check_study_folder(study, STUDY.name, "--out")  # accepted as dynlab's own


def test_mamba1_stack_scans_all_members_in_one_call_bit_for_bit(monkeypatch):
    """On the CPU the Mamba-1 stack runs all members' selective scans as one grouped call, and
    a float32 training with it (from carried states: the state-passing arm) equals one that
    scans member by member, bit for bit."""
    import dynlab.lm.train.stack as stack_module
    from dynlab.kernels.selective_scan import chunked as ss

    if ss._c_library() is None:
        pytest.skip(f"compiled selective scan {ss.compiled_kernel_status()}")
    grouped, calls = stack_module.selective_scan_grouped, []

    def counted(*a, **k):
        calls.append(a[0].shape[0])
        return grouped(*a, **k)

    def member_by_member(u, delta, A, B, C, init=None):
        outs = [ss.selective_scan_fused(u[i], delta[i], A[i], B[i], C[i], None if init is None else init[i], True)
                for i in range(u.shape[0])]
        return torch.stack([o[0] for o in outs]), torch.stack([o[1] for o in outs])

    def train(scan):
        monkeypatch.setattr(stack_module, "selective_scan_grouped", scan)
        _, ens = _solo_and_stack("mamba1", ["zero", "state-passing", "zero"], [3, 4, 5], steps=3, dtype=torch.float32)
        monkeypatch.undo()
        return [torch.cat([p.detach().reshape(-1) for p in e.model.parameters()]) for e in ens], [e.losses for e in ens]

    one_call, losses = train(counted)
    assert calls and set(calls) == {3}  # every layer's scan: the three members at once
    per_member, losses_pm = train(member_by_member)
    assert losses == losses_pm
    for a, b in zip(one_call, per_member):
        assert torch.equal(a, b)


def test_a_stack_saves_its_state_after_another_stack_removed_the_shared_folder(tmp_path, monkeypatch):
    """Stacks of one study share resume/; one that finishes removes the folder when it is
    empty, which it is while another stack has not saved yet (its first save is seconds
    away): that save makes the folder again instead of failing (FileNotFoundError)."""
    import shutil

    import dynlab.lm.run.text as run
    from dynlab.studies.length_generalization import make_specs
    from dynlab.runner.protocol import StudyOptions

    tiny = {"model": {"d_model": 16, "n_layers": 1, "n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
            "train": {"steps": 4, "batch_size": 2, "seq_len": 16, "engine": "stack"},
            "eval": {"length_multiple": 2, "n_samples": 2, "chunk_len": 16, "bin_width": 8, "effrem_points": 2,
                     "effrem_samples": 2}, "interventions": ["zero"]}
    specs = make_specs(StudyOptions(preset="quick", seeds=(0, 1), extra=tiny))
    monkeypatch.setattr(run, "SAVE_EVERY_S", 0.0)
    resume = tmp_path / "resume"
    seen = []

    def other_stack_finished(done, losses):
        seen.append(sorted(p.name for p in resume.iterdir()) if resume.exists() else None)
        if done == 2:
            shutil.rmtree(resume)  # what another stack's clean-up does to an empty shared folder

    out = run.train_and_evaluate_many(specs, "cpu", other_stack_finished, sync_every=1, resume_dir=resume)
    assert len(out) == 2 and not resume.exists()
    assert any(names and len(names) == 1 for names in seen[3:]), seen  # the state was written again after the removal
