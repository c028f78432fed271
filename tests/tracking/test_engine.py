"""Training engine: determinism, curriculum, schedule, divergence handling."""

import math

import numpy as np
import pytest
import torch

from dynlab.tracking.spec import CurriculumSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec
from dynlab.tracking.train import lr_at, resolve_device, train_tracker
from dynlab.tracking.train.engine import runs_generic_loop


def _spec(**train):
    base = {"steps": 12, "batch_size": 16, "lr": 3e-3, "warmup_steps": 2}
    base.update(train)
    return RunSpec(task=TaskSpec(group="S3"), model=ModelSpec(arch="tanh-rnn", hidden=8), train=TrainSpec(**base), seed=3)


def test_reruns_are_bit_identical_on_cpu():
    a = train_tracker(_spec(), torch.device("cpu"))
    torch.manual_seed(12345)  # global RNG state must not matter
    b = train_tracker(_spec(), torch.device("cpu"))
    assert a.losses == b.losses
    for (k, va), (_, vb) in zip(a.model.state_dict().items(), b.model.state_dict().items()):
        assert torch.equal(va, vb), k


def test_different_seeds_differ():
    a = train_tracker(_spec(), torch.device("cpu"))
    b = train_tracker(_spec().model_copy(update={"seed": 4}), torch.device("cpu"))
    assert a.losses != b.losses


def test_training_reduces_loss_on_c2():
    spec = RunSpec(
        task=TaskSpec(group="C2"),
        model=ModelSpec(arch="tanh-rnn", hidden=16),
        train=TrainSpec(steps=150, batch_size=32, lr=1e-2, warmup_steps=5),
    )
    res = train_tracker(spec, torch.device("cpu"))
    assert res.status == "ok"
    assert sum(res.losses[-10:]) / 10 < 0.5 * sum(res.losses[:10]) / 10
    assert res.lengths[-1] > res.lengths[0]  # the adaptive curriculum advanced


def test_adaptive_curriculum_rule():
    c = CurriculumSpec(min_length=2, max_length=60, advance_at=0.99, growth=0.25)
    assert c.next_length(2, 0, 100, 0.5) == 2
    assert c.next_length(2, 0, 100, 0.995) == 3
    assert c.next_length(40, 0, 100, 1.0) == 50
    assert c.next_length(58, 0, 100, 1.0) == 60


def test_linear_curriculum_rule():
    c = CurriculumSpec(mode="linear", min_length=10, max_length=60, ramp_fraction=0.5)
    lengths = [c.first_length(100)] + [c.next_length(0, s, 100, 0.0) for s in range(100)]
    assert lengths[0] == 10 and lengths[25] == 35 and all(L == 60 for L in lengths[50:])
    assert lengths == sorted(lengths)


def test_curriculum_refuses_impossible_lengths():
    with pytest.raises(ValueError, match="exceeds max_length"):
        CurriculumSpec(min_length=80, max_length=60)


def test_lr_schedule_warmup_then_cosine():
    tr = TrainSpec(steps=110, lr=1.0, warmup_steps=10, schedule="cosine")
    assert lr_at(tr, 0) == pytest.approx(0.1) and lr_at(tr, 9) == pytest.approx(1.0)
    assert lr_at(tr, 10) == pytest.approx(1.0)
    assert lr_at(tr, 60) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))
    assert lr_at(tr, 110) == pytest.approx(0.0, rel=0, abs=1e-12)


def test_lr_schedule_holds_until_the_curriculum_reaches_its_length():
    tr = TrainSpec(steps=110, lr=1.0, warmup_steps=10)  # schedule="curriculum"
    assert lr_at(tr, 0) == pytest.approx(0.1) and lr_at(tr, 9) == pytest.approx(1.0)
    assert lr_at(tr, 80) == 1.0  # max_length not reached yet: held
    # reached at step 30: cosine over the 80 remaining steps
    assert lr_at(tr, 30, reached=30) == pytest.approx(1.0)
    assert lr_at(tr, 70, reached=30) == pytest.approx(0.5 * (1 + math.cos(math.pi * 40 / 80)))
    assert lr_at(tr, 110, reached=30) == pytest.approx(0.0, rel=0, abs=1e-12)
    # reached during the warm-up: the decay starts after it, as with "cosine"
    assert lr_at(tr, 60, reached=3) == pytest.approx(0.5 * (1 + math.cos(math.pi * 0.5)))


def test_training_decays_from_the_step_the_curriculum_reached_its_length(used_lrs):
    """Record the rate the optimiser used at every step; recompute it independently from
    the recorded curriculum lengths (hold at lr, then cosine from the first step at 6)."""
    used = used_lrs
    spec = RunSpec(
        task=TaskSpec(group="C2"),
        model=ModelSpec(arch="tanh-rnn", hidden=16),
        train=TrainSpec(steps=40, batch_size=32, lr=1e-2, warmup_steps=2,
                        curriculum=CurriculumSpec(min_length=2, max_length=6, advance_at=0.5)),
        seed=0,
    )
    res = train_tracker(spec, torch.device("cpu"))
    reached = res.lengths.index(6)
    assert 2 < reached < 30  # the curriculum got there during training, after the warm-up
    expect = [1e-2 * (s + 1) / 2 if s < 2 else 1e-2 if s < reached
              else 0.5e-2 * (1 + math.cos(math.pi * (s - reached) / (40 - reached))) for s in range(40)]
    np.testing.assert_allclose(used, expect, rtol=1e-12, atol=0)


def test_diverging_run_is_stopped_and_reported():
    spec = RunSpec(
        task=TaskSpec(group="C2"),
        model=ModelSpec(arch="linear-rnn", hidden=8),
        train=TrainSpec(steps=50, batch_size=8, lr=1e6, warmup_steps=0, clip=1e9),
    )
    res = train_tracker(spec, torch.device("cpu"))
    assert res.status == "diverged"
    assert "non-finite" in res.reason
    assert len(res.losses) < 50


def test_device_resolution():
    assert resolve_device("cpu").type == "cpu"
    assert resolve_device("auto").type == ("cuda" if torch.cuda.is_available() else "cpu")
    with pytest.raises(ValueError, match="allowed"):
        resolve_device("tpu")
    if not torch.cuda.is_available():
        with pytest.raises(ValueError, match="CUDA is not available"):
            resolve_device("cuda")


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_same_code_runs_on_cuda():
    res = train_tracker(_spec(), torch.device("cuda"))
    assert res.status == "ok" and next(res.model.parameters()).is_cuda


@pytest.mark.filterwarnings("ignore::UserWarning")  # torch.compile's tracer touches .grad of non-leaf tensors
@pytest.mark.slow
def test_compiled_cell_steps_train_to_the_same_numbers():
    """``compile=True`` (torch.compile'd per-step transition) matches eager on a cell trained
    through the generic loop (relu: no fused kernel)."""
    from dynlab.tracking.spec import CurriculumSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec

    cur = CurriculumSpec(min_length=3, max_length=5)
    spec = RunSpec(
        task=TaskSpec(group="S3"),
        model=ModelSpec(arch="state-gated-rnn", hidden=8, nonlinearity="relu"),
        train=TrainSpec(steps=3, batch_size=4, curriculum=cur),
    )
    eager = train_tracker(spec, torch.device("cpu"))
    comp = train_tracker(spec, torch.device("cpu"), compile=True)
    torch.testing.assert_close(torch.tensor(comp.losses), torch.tensor(eager.losses), rtol=1e-5, atol=1e-6)
    for (name, a), (_, b) in zip(eager.model.named_parameters(), comp.model.named_parameters()):
        torch.testing.assert_close(b, a, rtol=1e-5, atol=1e-6, msg=name)
    assert runs_generic_loop(comp.model)  # so the compiled step was used
    assert "transition" not in comp.model.cells[0].__dict__  # and is removed afterwards


def test_runs_generic_loop_only_where_no_kernel_applies():
    from dynlab.tracking.models import Tracker

    assert not runs_generic_loop(Tracker("tanh-rnn", 4, 4, hidden=8))  # fused kernel
    assert not runs_generic_loop(Tracker("mamba", 4, 4, hidden=8))  # diagonal scan
    assert not runs_generic_loop(Tracker("aussm", 4, 4, hidden=8))
    assert runs_generic_loop(Tracker("mamba", 4, 4, hidden=8, nonlinearity="tanh"))  # no scan for a tanh mamba
    assert runs_generic_loop(Tracker("state-gated-rnn", 4, 4, hidden=8, nonlinearity="relu"))


@pytest.mark.slow
def test_keep_freed_memory_sets_the_allocator_once_and_can_be_turned_off(tmp_path):
    """glibc's mallopt accepts the settings (Linux); the environment variable turns them off."""
    import subprocess
    import sys

    code = "from dynlab.runtime import keep_freed_memory as k; print(k(), k())"
    on = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path).stdout.split()
    env = {**__import__("os").environ, "DYNLAB_KEEP_FREED_MEMORY": "0"}
    off = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=tmp_path, env=env).stdout.split()
    assert off == ["False", "False"]
    if sys.platform.startswith("linux") and __import__("platform").libc_ver()[0] == "glibc":
        assert on == ["True", "True"]
