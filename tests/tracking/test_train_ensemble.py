"""Ensemble training equals solo training member by member; divergence drops one member."""

from __future__ import annotations

import pytest
import torch

from dynlab.tracking.spec import CurriculumSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec
from dynlab.tracking.train import train_tracker
from dynlab.tracking.train.ensemble import check_ensemble, train_ensemble

CPU = torch.device("cpu")


def _specs(arch: str) -> list[RunSpec]:
    """Three members: different seeds, groups of one order, lr, warm-up, curriculum thresholds."""
    out = []
    for group, seed, lr, warm, adv in [("C6", 0, 3e-3, 2, 0.2), ("S3", 5, 1e-2, 0, 0.4), ("C6", 2, 2e-3, 4, 0.99)]:
        cur = CurriculumSpec(min_length=2, max_length=9, advance_at=adv, growth=0.5)
        train = TrainSpec(steps=8, batch_size=8, lr=lr, warmup_steps=warm, weight_decay=0.01 * seed, curriculum=cur)
        out.append(RunSpec(task=TaskSpec(group=group), model=ModelSpec(arch=arch, hidden=12), train=train, seed=seed))
    return out


@pytest.mark.parametrize("arch", ["tanh-rnn", "linear-rnn", "token-gated-rnn", "mamba", "aussm", "state-gated-rnn"])
def test_ensemble_equals_solo_training(arch):
    specs = _specs(arch)
    solo = [train_tracker(s, CPU) for s in specs]
    ens = train_ensemble(specs, CPU)
    assert len({tuple(r.lengths) for r in solo}) > 1, "members should follow different curricula"
    for s, a, b in zip(specs, solo, ens):
        assert (a.status, b.status) == ("ok", "ok")
        assert b.lengths == a.lengths, s.seed
        torch.testing.assert_close(torch.tensor(b.losses), torch.tensor(a.losses), rtol=1e-5, atol=1e-6)
        assert abs(b.final_train_accuracy - a.final_train_accuracy) < 1e-6
        for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
            torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-5, msg=name)


def test_fused_ensemble_with_two_threads_equals_solo_training():
    """tanh-rnn members (fused kernel, batched GEMMs) on 2 intra-op threads match solo runs."""
    specs = _specs("tanh-rnn")
    ens = train_ensemble(specs, CPU, threads=2)
    for s, b in zip(specs, ens):
        a = train_tracker(s, CPU)
        assert b.status == "ok" and b.lengths == a.lengths
        torch.testing.assert_close(torch.tensor(b.losses), torch.tensor(a.losses), rtol=1e-5, atol=1e-6)
        for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
            torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-5, msg=name)


def test_diverging_member_is_dropped_and_others_continue():
    specs = _specs("tanh-rnn")
    bad = specs[1].model_copy(update={"train": specs[1].train.model_copy(update={"lr": 1e37, "warmup_steps": 0})})
    specs[1] = bad
    solo_bad = train_tracker(bad, CPU)
    assert solo_bad.status == "diverged"
    ens = train_ensemble(specs, CPU)
    assert ens[1].status == "diverged" and ens[1].reason == solo_bad.reason
    assert ens[1].lengths == solo_bad.lengths
    for pa, pb in zip(solo_bad.model.parameters(), ens[1].model.parameters()):
        torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-5, equal_nan=True)
    for i in (0, 2):
        solo = train_tracker(specs[i], CPU)
        assert ens[i].status == "ok" and len(ens[i].losses) == specs[i].train.steps
        torch.testing.assert_close(torch.tensor(ens[i].losses), torch.tensor(solo.losses), rtol=1e-5, atol=1e-6)


def test_members_with_different_step_counts_stop_on_time():
    specs = _specs("mamba")[:2]
    short = specs[0].model_copy(update={"train": specs[0].train.model_copy(update={"steps": 3})})
    ens = train_ensemble([short, specs[1]], CPU)
    solo = train_tracker(short, CPU)
    assert len(ens[0].losses) == 3 and len(ens[1].losses) == specs[1].train.steps
    for pa, pb in zip(solo.model.parameters(), ens[0].model.parameters()):
        torch.testing.assert_close(pb, pa, rtol=1e-4, atol=1e-5)


def test_incompatible_members_are_refused():
    a, b = _specs("tanh-rnn")[:2]
    other = b.model_copy(update={"model": ModelSpec(arch="tanh-rnn", hidden=16)})
    with pytest.raises(ValueError, match="model spec"):
        check_ensemble([a, other])
    c2 = b.model_copy(update={"task": TaskSpec(group="C2")})
    with pytest.raises(ValueError, match="group order"):
        train_ensemble([a, c2], CPU)
    with pytest.raises(ValueError, match="at least one"):
        train_ensemble([], CPU)


def test_group_tracking_run_many_matches_run_one():
    from dynlab.studies.group_tracking import STUDY
    from dynlab.runner.protocol import StudyOptions

    extra = {"train": {"steps": 6}, "eval": {"n_samples": 8, "batch_size": 8, "lengths": (5, 10), "chunk": 10}}
    specs = STUDY.make_specs(StudyOptions(preset="smoke", models=("tanh-rnn",), extra={"groups": ("C6", "S3"), **extra}))
    items = STUDY.work_items(specs)
    assert [len(i) for i in items] == [2]
    tanh_mamba = {**extra, "model": {"nonlinearity": "tanh"}}
    alone = STUDY.make_specs(StudyOptions(preset="smoke", models=("mamba",), extra={"groups": ("C6", "S3"), **tanh_mamba}))
    assert [len(i) for i in STUDY.work_items(alone)] == [1, 1]  # no fused kernel for this φ: they train alone
    diagonal = STUDY.make_specs(StudyOptions(preset="smoke", models=("mamba",), extra={"groups": ("C6", "S3"), **extra}))
    assert [len(i) for i in STUDY.work_items(diagonal)] == [2]  # the fused diagonal kernel stacks
    many = STUDY.stacking.run(items[0], CPU, None)
    for spec, out in zip(specs, many):
        one = STUDY.run_one(spec, CPU, None)
        # 6 steps never reach the training length: evaluated, but not learned (run_status)
        assert out.result.status == one.result.status == "not-learned"
        assert out.result.reason == one.result.reason
        assert out.result.curriculum_length == one.result.curriculum_length
        assert abs(out.result.train_loss - one.result.train_loss) < 1e-5
        assert out.result.ensemble_size == 2
        assert set(one.result.to_json()) <= set(out.result.to_json())


@pytest.mark.slow
def test_bench_train_reports_consistent_ratios(tmp_path):
    """``dynlab bench train`` at a tiny size: the JSON ratios follow from its own rows."""
    import json

    from dynlab.cli import main

    out = tmp_path / "bench.json"
    code = main(
        ["bench", "train", "-m", "tanh-rnn,mamba", "--hidden", "8", "--batch", "4", "--length", "5",
         "--ensembles", "3", "--steps", "3", "--json", str(out)]
    )
    assert code == 0
    payload = json.loads(out.read_text())
    for res in payload["results"]:
        rows = {r["method"]: r for r in res["rows"]}
        base = next(r for m, r in rows.items() if m.startswith("baseline"))
        best = max(r["tokens_per_s"] for m, r in rows.items() if m.startswith("dynlab"))
        assert {"dynlab", "dynlab ensemble-3"} <= set(rows)
        assert rows["dynlab ensemble-3"]["models"] == 3
        assert res["speedup_vs_baseline"] == pytest.approx(best / base["tokens_per_s"])
        floor = res["floor_tokens_per_s"]  # how each kind of floor is made: tests/bench/test_bench_train.py
        assert res["fraction_of_floor"] == pytest.approx(best / floor)
    assert payload["results"][0]["flops_per_token"] == 6 * (8 * 8 + 8 * 6)  # dense: 6·(S² + H·C), S3 has 6 classes
    assert payload["speedup_vs_baseline"] == payload["results"][0]["speedup_vs_baseline"]
    assert main(["bench", "train", "--ensembles", "0", "--hidden", "8"]) == 2  # bad input: one-line error


def test_floor_counts_every_state_matrix():
    """The floor's FLOPs per token: 6·(m·S² + S·C), m = 2 for the state-gated cell (A and U)."""
    from dynlab.bench import flops_per_token

    assert flops_per_token("tanh-rnn", 8, 6, 4) == 6 * (8 * 8 + 8 * 6)
    assert flops_per_token("state-gated-rnn", 8, 6, 4) == 6 * (2 * 8 * 8 + 8 * 6)
    assert flops_per_token("mamba", 8, 6, 4) == 6 * (2 * 32 + 8 * 6)  # S = H·N = 32


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_ensemble_on_cuda_matches_cpu_solo():
    specs = _specs("tanh-rnn")
    ens = train_ensemble(specs, torch.device("cuda"))
    for s, b in zip(specs, ens):
        a = train_tracker(s, CPU)
        assert b.lengths == a.lengths
        torch.testing.assert_close(torch.tensor(b.losses), torch.tensor(a.losses), rtol=1e-4, atol=1e-5)


# -- reproducibility: the numbers do not depend on where a spec runs ------------------------

FUSED_ARCHS = ["tanh-rnn", "linear-rnn", "token-gated-rnn", "state-gated-rnn", "mamba", "negative-mamba",
               "mamba3", "aussm"]


@pytest.fixture
def machine_threads():
    """Set this process's intra-op thread count, as a machine with that many cores would."""
    old = torch.get_num_threads()
    yield torch.set_num_threads
    torch.set_num_threads(old)


def _assert_same_run(a, b, what: str) -> None:
    assert (a.status, a.lengths, a.losses) == (b.status, b.lengths, b.losses), what
    assert a.final_train_accuracy == b.final_train_accuracy, what
    for (name, pa), (_, pb) in zip(a.model.named_parameters(), b.model.named_parameters()):
        assert torch.equal(pa, pb), f"{what}: {name}"


@pytest.mark.parametrize("arch", FUSED_ARCHS)
def test_fused_ensemble_is_bit_identical_to_solo(arch):
    """Members at different curriculum lengths (no padding any more) match solo runs bit for bit."""
    specs = _specs(arch)
    ens = train_ensemble(specs, CPU)
    assert len({tuple(r.lengths) for r in ens}) > 1, "members should follow different curricula"
    for s, b in zip(specs, ens):
        _assert_same_run(train_tracker(s, CPU), b, f"{arch} seed {s.seed}")


@pytest.mark.slow
def test_readme_ensemble_of_16_equals_solo_whatever_the_machine_thread_count(machine_threads):
    """docs/usage.md's example: 16 tanh-rnn S3 members at H=128 (train steps cut to 60) on a
    "2-core machine" vs each member alone on a "1-core machine": bit-identical."""
    specs = [RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn", hidden=128),
                     train=TrainSpec(steps=60), seed=s) for s in range(16)]
    machine_threads(2)
    ens = train_ensemble(specs, CPU)
    assert len({tuple(r.lengths) for r in ens}) > 1, "members should reach new lengths at different steps"
    machine_threads(1)
    first_to_grow = min(range(16), key=lambda i: ens[i].lengths.index(max(ens[i].lengths)))
    for i in sorted({0, 15, first_to_grow}):
        _assert_same_run(train_tracker(specs[i], CPU), ens[i], f"member {i}")
    assert torch.get_num_threads() == 1  # the machine's count is restored after training


def test_build_tracker_does_not_depend_on_the_thread_count(machine_threads):
    """The orthogonal initialisation (a QR factorisation) rounds by thread count unless fixed."""
    from dynlab.tracking.train import build_tracker

    built = []
    for n in (1, 2):
        machine_threads(n)
        built.append(build_tracker(ModelSpec(arch="tanh-rnn", hidden=64), 6, 6, seed=3))
    for (name, a), (_, b) in zip(built[0].named_parameters(), built[1].named_parameters()):
        assert torch.equal(a, b), name


def test_train_threads_is_fixed_by_the_spec_not_the_machine(machine_threads):
    from dynlab.runtime import MAX_THREADS, RUN_THREADS, train_threads

    for machine in (1, 2, 3):
        machine_threads(machine)
        with train_threads(CPU) as n:
            assert n == RUN_THREADS == torch.get_num_threads() == 1
        assert torch.get_num_threads() == machine
        with train_threads(CPU, threads=2) as n:
            assert n == torch.get_num_threads() == 2
    for bad in (0, -1, MAX_THREADS + 1, 1.5):
        with pytest.raises(ValueError, match=f"threads must be an integer in 1..{MAX_THREADS}"):
            with train_threads(CPU, threads=bad):
                pass


@pytest.mark.parametrize("arch", ["tanh-rnn", "state-gated-rnn"])
def test_a_stack_cut_into_calls_keeps_every_member_bit_identical(arch, monkeypatch):
    """With MAX_STACK = 2 the members run through the fused kernel two at a time (and the
    length groups split unevenly): each member's run is still exactly its solo run."""
    from dynlab.tracking.train import ensemble

    monkeypatch.setattr(ensemble, "MAX_STACK", 2)
    specs = _specs(arch)
    assert len(specs) > 2
    ens = train_ensemble(specs, CPU)
    for s, b in zip(specs, ens):
        _assert_same_run(train_tracker(s, CPU), b, f"{arch} seed {s.seed}")
