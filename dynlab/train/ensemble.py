"""Train an ensemble of trackers together: one leading model dimension, one loop.

N run specs that share the architecture and shapes (``ModelSpec``, batch size, vocabulary
and class count) are trained as one stacked model: parameters ``[N, …]``
(:func:`torch.func.stack_module_state`); the loss is a fused kernel on the stacked
parameters for the dense cells (:func:`dynlab.train.engine.fused_loss`, one batched GEMM
per step for all members) and
:func:`dynlab.train.engine.tracker_logits` under :func:`torch.func.vmap` otherwise; AdamW,
clipping, the learning rate schedule and the curriculum run per member on the stacked
tensors.

Equality with solo training (:func:`dynlab.train.engine.train_tracker`), member by member:

- initial parameters come from :func:`build_tracker` with the member's own seed, and every
  batch from the member's own ``torch.Generator`` seeded like the solo run, with the same
  sequence of ``sample`` calls;
- curriculum: every member keeps its own length L_i.  A step splits the members by
  length and runs each length's members as one stack of exactly that length (no
  padding), so every sum over positions or over the batch adds the same terms in the
  same order as the solo run (zero padding would change the blocking of those sums,
  hence their rounding);
- loss = mean cross-entropy per member; the gradient is taken of the sum of the member
  losses (members share no parameters, so each member gets its own gradient);
- clipping uses each member's own global norm (the norm of its per-parameter norms, as
  ``clip_grad_norm_``) and AdamW follows ``torch.optim.AdamW``'s single-tensor update
  with each member's learning rate (``lr_at``) and weight decay.

On the CPU, on the intra-op thread count fixed by :func:`dynlab.train.engine.train_threads`
(one), members trained by the fused kernels (tanh-rnn, linear-rnn, token- and
state-gated RNNs) are bit-identical to solo training, whatever the ensemble size (tests:
16 tanh-rnn S3 members, and each kernel at a small size).  Other cells (the
:func:`torch.func.vmap` path) and CUDA agree up to floating-point rounding (batched ops
may block their sums differently).  A member whose loss
or gradient becomes non-finite is reported ``status="diverged"`` with the same reason
text as the solo engine and is removed from the stack; the others go on.
"""

from __future__ import annotations

import copy

import torch
import torch.nn.functional as F
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from dynlab.config import RunSpec
from dynlab.groups import get_group
from dynlab.kernels.dense_tracker import BUFFERS
from dynlab.models import Tracker
from dynlab.tasks import WordProblem
from dynlab.train.engine import (
    TrainResult,
    build_tracker,
    fused_kind,
    fused_loss,
    lr_at,
    tracker_logits,
    train_threads,
)
from dynlab.train.progress import NullProgress

__all__ = ["check_ensemble", "ensemble_key", "train_ensemble"]

_BETA1, _BETA2, _EPS = 0.9, 0.999, 1e-8  # torch.optim.AdamW defaults, as in the engine


def ensemble_key(spec: RunSpec) -> tuple:
    """Specs with equal keys can share an ensemble: same model, batch size and group order."""
    return (spec.model.canonical_json(), spec.train.batch_size, get_group(spec.task.group).order)


def check_ensemble(specs: list[RunSpec]) -> None:
    """Raise ``ValueError`` unless ``specs`` is a non-empty list with one :func:`ensemble_key`."""
    if not specs:
        raise ValueError("an ensemble needs at least one spec, got none")
    keys = {ensemble_key(s) for s in specs}
    if len(keys) > 1:
        raise ValueError(
            "ensemble members must share model spec, batch_size and group order; "
            f"got {len(keys)} different combinations"
        )


class _Logits(nn.Module):
    """``tracker_logits`` as a module so ``functional_call`` can swap its parameters."""

    def __init__(self, model: Tracker):
        super().__init__()
        self.model = model

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return tracker_logits(self.model, tokens)


def _expand(v: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """Per-member values ``[K]`` shaped to broadcast against ``like [K, …]``."""
    return v.reshape(-1, *([1] * (like.dim() - 1)))


def train_ensemble(
    specs: list[RunSpec], device: torch.device, progress: NullProgress | None = None, *, threads: int | None = None
) -> list[TrainResult]:
    """Train the trackers of ``specs`` together; return one :class:`TrainResult` per spec.

    Every member's result equals ``train_tracker(spec, device)`` (bit for bit for the
    fused kernels on the CPU, else up to rounding); see the module docstring for how each
    piece keeps that equality.  ``threads``: CPU intra-op threads (None:
    :data:`dynlab.train.engine.RUN_THREADS`, as solo runs); another count changes the
    rounding, so it no longer matches the default solo run bit for bit.
    """
    check_ensemble(specs)
    progress = progress or NullProgress()
    tasks = [WordProblem(get_group(s.task.group)) for s in specs]
    models = [build_tracker(s.model, t.n_tokens, t.n_classes, s.seed).to(device) for s, t in zip(specs, tasks)]
    try:
        with train_threads(device, threads=threads):
            return _train_stack(specs, tasks, models, device, progress)
    finally:
        BUFFERS.clear()  # the fused kernels' scratch buffers are not kept after training


def _train_stack(specs, tasks, models, device, progress) -> list[TrainResult]:
    n = len(specs)
    results = [TrainResult(model=m) for m in models]
    gens = [torch.Generator().manual_seed(s.seed) for s in specs]
    trains = [s.train for s in specs]
    lengths = [tr.curriculum.first_length(tr.steps) for tr in trains]
    reached: list[int | None] = [None] * n  # per member: first step at max_length (lr_at)
    batch = trains[0].batch_size

    template = _Logits(copy.deepcopy(models[0]))
    params, buffers = stack_module_state([_Logits(m) for m in models])  # {name: [N, …]}
    params = {k: v.detach().clone() for k, v in params.items()}
    names = list(params)
    exp_avg = {k: torch.zeros_like(v) for k, v in params.items()}
    exp_avg_sq = {k: torch.zeros_like(v) for k, v in params.items()}
    alive = list(range(n))  # position in the stack -> member index

    def logits_fn(p, b, tok):
        return functional_call(template, (p, b), (tok,))

    batched_logits = vmap(logits_fn)
    fused = fused_kind(template.model)
    phi = template.model.cells[0].phi if fused else None
    bar = progress.add(f"train ensemble {specs[0].model.arch} ×{n}", max(tr.steps for tr in trains))

    def retire(keep_pos: list[int], save: bool = True) -> None:
        """Drop the members not in ``keep_pos`` (copying them into their models if ``save``)."""
        nonlocal params, exp_avg, exp_avg_sq, buffers, alive
        gone = [pos for pos in range(len(alive)) if pos not in keep_pos]
        for pos in gone if save else ():
            _unstack_into(results[alive[pos]].model, params, buffers, pos)
        idx = torch.tensor(keep_pos, dtype=torch.long, device=device)
        params = {k: v.index_select(0, idx) for k, v in params.items()}
        buffers = {k: v.index_select(0, idx) for k, v in buffers.items()}
        exp_avg = {k: v.index_select(0, idx) for k, v in exp_avg.items()}
        exp_avg_sq = {k: v.index_select(0, idx) for k, v in exp_avg_sq.items()}
        alive = [alive[pos] for pos in keep_pos]

    step = 0
    while alive:
        finished = [pos for pos, i in enumerate(alive) if step >= trains[i].steps]
        if finished:
            retire([pos for pos in range(len(alive)) if pos not in finished])
            if not alive:
                break
        k = len(alive)
        l_max = max(lengths[i] for i in alive)
        for i in alive:
            if reached[i] is None and lengths[i] >= trains[i].curriculum.max_length:
                reached[i] = step
        leaves = {kk: v.requires_grad_(True) for kk, v in params.items()}
        part_losses, part_correct, part_pos = [], [], []
        for length, poss in _by_length(alive, lengths).items():  # one stack per length, no padding
            tokens, labels = _sample(tasks, gens, [alive[pos] for pos in poss], batch, length)
            tokens, labels = tokens.to(device), labels.to(device)
            if len(poss) == k:
                sub, sub_buffers = leaves, buffers
            else:
                idx = torch.tensor(poss, dtype=torch.long, device=device)
                sub = {kk: v.index_select(0, idx) for kk, v in leaves.items()}
                sub_buffers = {kk: v.index_select(0, idx) for kk, v in buffers.items()}
            n_valid = batch * length
            if fused:  # a fused kernel, the stack's members in each batched GEMM
                stacked = {kk.removeprefix("model."): v for kk, v in sub.items()}
                sums, n_correct = fused_loss(fused, stacked, phi, tokens, labels)
                part_losses.append(sums / n_valid)  # [K_L] mean over each member's tokens
            else:
                logits = batched_logits(sub, sub_buffers, tokens)  # [K_L, B, L, C]
                part_losses.append(vmap(_mean_ce)(logits, labels))  # [K_L], as the solo engine's loss
                n_correct = (logits.detach().argmax(-1) == labels).flatten(1).sum(1)
            part_correct.append(n_correct.to(torch.float32) / n_valid)
            part_pos.extend(poss)
        back = torch.argsort(torch.tensor(part_pos, device=device))  # stack position order
        losses = torch.cat(part_losses)[back]  # [K]
        correct = torch.cat(part_correct)[back]  # [K] batch accuracy per member
        loss_ok = torch.isfinite(losses)
        grads = torch.autograd.grad(torch.where(loss_ok, losses, 0.0).sum(), [leaves[kk] for kk in names])
        for v in params.values():
            v.requires_grad_(False)
        with torch.no_grad():
            norms = torch.stack([torch.linalg.vector_norm(g.flatten(1), dim=1) for g in grads], dim=1)  # [K, P]
            gnorm = torch.linalg.vector_norm(norms, dim=1)  # [K]
            grad_ok = torch.isfinite(gnorm)
            ok = (loss_ok & grad_ok).tolist()
            loss_ok_l = loss_ok.tolist()
            bad = [pos for pos in range(k) if not ok[pos]]
            for pos in bad:  # a diverged member keeps its parameters from before this step
                _unstack_into(results[alive[pos]].model, params, buffers, pos)
            lrs = torch.tensor([lr_at(trains[i], step, reached[i]) for i in alive], dtype=torch.float64, device=device)
            wds = torch.tensor([trains[i].weight_decay for i in alive], dtype=torch.float64, device=device)
            clips = torch.tensor([trains[i].clip for i in alive], dtype=torch.float32, device=device)
            coef = torch.clamp(clips / (gnorm + 1e-6), max=1.0)  # [K]
            t = step + 1
            bc1 = 1 - _BETA1**t
            bc2_sqrt = (1 - _BETA2**t) ** 0.5
            decay = 1 - lrs * wds
            neg_step = -(lrs / bc1)
            for kk, g in zip(names, grads):
                p, m, v = params[kk], exp_avg[kk], exp_avg_sq[kk]
                g = g * _expand(coef, g)
                p.mul_(_expand(decay.to(p.dtype), p))
                m.lerp_(g, 1 - _BETA1)
                v.mul_(_BETA2).addcmul_(g, g, value=1 - _BETA2)
                denom = (v.sqrt() / bc2_sqrt).add_(_EPS)
                p.add_(_expand(neg_step.to(p.dtype), p) * m / denom)
        accs = correct.tolist()
        lvals = losses.detach().tolist()
        for pos, i in enumerate(alive):
            if not ok[pos]:
                kind = "loss" if not loss_ok_l[pos] else "gradient"
                results[i].status = "diverged"
                results[i].reason = f"non-finite {kind} at step {step} (length {lengths[i]})"
                continue
            results[i].losses.append(lvals[pos])
            results[i].lengths.append(lengths[i])
            results[i].final_train_accuracy = accs[pos]
            lengths[i] = trains[i].curriculum.next_length(lengths[i], step, trains[i].steps, accs[pos])
        if bad:
            retire([pos for pos in range(k) if ok[pos]], save=False)
        progress.update(bar, 1, K=len(alive), L=l_max)
        step += 1
    progress.remove(bar)
    for r in results:
        r.model.eval()
    return results


def _by_length(alive: list[int], lengths: list[int]) -> dict[int, list[int]]:
    """Stack positions of the alive members, by their current curriculum length."""
    out: dict[int, list[int]] = {}
    for pos, i in enumerate(alive):
        out.setdefault(lengths[i], []).append(pos)
    return out


def _mean_ce(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """One member's loss as the solo engine computes it: mean cross-entropy of ``logits
    [B, L, C]`` against ``labels [B, L]`` (nats per token)."""
    return F.cross_entropy(logits.flatten(0, 1), labels.flatten())


def _sample(tasks, gens, members: list[int], batch: int, length: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The batches of ``members`` (all at curriculum length ``length``), each from the
    member's own generator (the solo engine's call): ``tokens, labels [K, B, length]``."""
    pairs = [tasks[i].sample(gens[i], batch, length) for i in members]
    return torch.stack([t for t, _ in pairs]), torch.stack([lab for _, lab in pairs])


def _unstack_into(model: nn.Module, params: dict, buffers: dict, pos: int) -> None:
    """Copy stacked entry ``pos`` of ``params``/``buffers`` (names ``model.…``) into ``model``."""
    with torch.no_grad():
        own = dict(model.named_parameters())
        own.update(dict(model.named_buffers()))
        for kk, v in list(params.items()) + list(buffers.items()):
            own[kk.removeprefix("model.")].copy_(v[pos])
