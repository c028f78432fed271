"""The one training loop against a plain torch loop written here, per member.

The reference is what a newcomer would write: the model from ``build_tracker``, one
``torch.optim.AdamW`` per model, ``clip_grad_norm_`` every step, the member's own batches
(``WordProblem.sample`` from a generator seeded with the seed), the curriculum rule and the
learning-rate schedule written out below.  The loss is the engine's ``tracker_loss`` (itself
tested against ``F.cross_entropy(model(tokens).logits, …)`` in tests/kernels/test_tracker_loss_dense.py).
"""

from __future__ import annotations

import math

import pytest
import torch

from dynlab.tracking.spec import CurriculumSpec, ModelSpec, RunSpec, TaskSpec, TrainSpec
from dynlab.tracking.groups import get_group
from dynlab.tracking.task import WordProblem
from dynlab.tracking.train import build_tracker, train_ensemble, train_tracker
from dynlab.tracking.train.engine import tracker_loss

CPU = torch.device("cpu")


def _lr(tr: TrainSpec, step: int, reached: int | None) -> float:
    """Warm-up, then cosine to 0 from the warm-up's end (or, for the curriculum schedule,
    held at lr until the curriculum first reaches max_length and cosine from there)."""
    w = tr.warmup_steps
    if step < w:
        return tr.lr * (step + 1) / w
    start = w
    if tr.schedule == "curriculum":
        if reached is None:
            return tr.lr
        start = max(w, reached)
    return 0.5 * tr.lr * (1 + math.cos(math.pi * (step - start) / max(1, tr.steps - start)))


def _plain_loop(spec: RunSpec):
    """``(losses, lengths, final accuracy, model)`` of ``spec`` trained by a plain loop."""
    tr = spec.train
    task = WordProblem(get_group(spec.task.group))
    model = build_tracker(spec.model, task.n_tokens, task.n_classes, spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=tr.lr, weight_decay=tr.weight_decay)
    gen = torch.Generator().manual_seed(spec.seed)
    length, reached, losses, lengths, acc = tr.curriculum.first_length(tr.steps), None, [], [], math.nan
    torch.set_num_threads(1)  # the engine's fixed count (RUN_THREADS)
    for step in range(tr.steps):
        if reached is None and length >= tr.curriculum.max_length:
            reached = step
        tokens, labels = task.sample(gen, tr.batch_size, length)
        for g in opt.param_groups:
            g["lr"] = _lr(tr, step, reached)
        loss, acc_t = tracker_loss(model, tokens, labels)
        opt.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), tr.clip)
        opt.step()
        losses.append(loss.item())
        lengths.append(length)
        acc = acc_t.item()
        length = tr.curriculum.next_length(length, step, tr.steps, acc)
    return losses, lengths, acc, model


@pytest.fixture
def one_thread():
    old = torch.get_num_threads()
    yield
    torch.set_num_threads(old)


def _spec(arch: str, seed: int = 3, nonlinearity: str | None = None, **train) -> RunSpec:
    cur = CurriculumSpec(min_length=2, max_length=7, advance_at=0.3, growth=0.5)
    base = {"steps": 10, "batch_size": 8, "lr": 1e-2, "warmup_steps": 2, "weight_decay": 0.01, "clip": 0.5,
            "curriculum": cur}
    base.update(train)
    model = ModelSpec(arch=arch, hidden=12, **({"nonlinearity": nonlinearity} if nonlinearity else {}))
    return RunSpec(task=TaskSpec(group="S3"), model=model, train=TrainSpec(**base), seed=seed)


@pytest.mark.parametrize(
    "arch, nonlinearity, schedule",
    [("tanh-rnn", None, "curriculum"), ("token-gated-rnn", None, "cosine"), ("state-gated-rnn", None, "curriculum"),
     ("mamba", None, "cosine"), ("state-gated-rnn", "relu", "curriculum")],
)
def test_solo_run_is_the_plain_loop_bit_for_bit(arch, nonlinearity, schedule, one_thread):
    """A solo run (an ensemble of one) equals the plain loop exactly: fused kernel, diagonal
    scan and generic per-step loop alike."""
    spec = _spec(arch, nonlinearity=nonlinearity, schedule=schedule)
    losses, lengths, acc, model = _plain_loop(spec)
    res = train_tracker(spec, CPU)
    assert res.status == "ok"
    assert len(set(lengths)) > 1, "the curriculum should move"
    assert (res.losses, res.lengths, res.final_train_accuracy) == (losses, lengths, acc)
    for (name, a), (_, b) in zip(model.named_parameters(), res.model.named_parameters()):
        assert torch.equal(a, b), name


@pytest.mark.parametrize("arch", ["tanh-rnn", "mamba"])
def test_stacked_adamw_equals_one_optimiser_per_member(arch, one_thread):
    """Members with their own lr, warm-up, weight decay, clip and seed, trained as one stack
    by ``torch.optim.AdamW`` (one group per member), against one plain loop (one AdamW) per
    member: bit-identical for the fused kernel; the vmap path to rounding."""
    specs = [_spec(arch, seed=0, lr=3e-3, warmup_steps=0, weight_decay=0.0, clip=1.0),
             _spec(arch, seed=5, lr=2e-2, warmup_steps=3, weight_decay=0.1, clip=0.05),
             _spec(arch, seed=2, lr=1e-2, warmup_steps=1, weight_decay=0.01, clip=0.5, steps=6)]
    ens = train_ensemble(specs, CPU)
    for spec, res in zip(specs, ens):
        losses, lengths, acc, model = _plain_loop(spec)
        assert res.status == "ok" and res.lengths == lengths and len(res.losses) == spec.train.steps
        if arch == "tanh-rnn":
            assert res.losses == losses and res.final_train_accuracy == acc
        torch.testing.assert_close(torch.tensor(res.losses), torch.tensor(losses), rtol=1e-5, atol=1e-6)
        for (name, a), (_, b) in zip(model.named_parameters(), res.model.named_parameters()):
            if arch == "tanh-rnn":
                assert torch.equal(a, b), name
            torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-5, msg=name)


def test_clipping_is_per_member():
    """A member clipped to a norm far below AdamW's eps (1e-8) barely moves; its twin with a
    loose clip is unchanged by it (the same numbers as alone)."""
    loose, tight = _spec("tanh-rnn", clip=10.0, steps=3), _spec("tanh-rnn", clip=1e-12, steps=3)
    ens = train_ensemble([loose, tight], CPU)
    assert ens[0].losses == train_tracker(loose, CPU).losses
    task = WordProblem(get_group("S3"))
    start = build_tracker(loose.model, task.n_tokens, task.n_classes, loose.seed)
    moved = [sum((p - q).abs().sum().item() for p, q in zip(r.model.parameters(), start.parameters())) for r in ens]
    assert moved[1] < 0.05 * moved[0]
