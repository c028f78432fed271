"""The training loop: N trackers trained together as one stack; a solo run is N = 1.

N run specs that share the architecture and shapes (``ModelSpec``, batch size, vocabulary
and class count: :func:`check_ensemble`) are trained as one stacked model, parameters
``{name: [N, …]}`` (:func:`torch.func.stack_module_state`).  Each step, for each member:

- batch: from the member's own ``torch.Generator`` seeded with its seed, at its own
  curriculum length L_i.  The members at one length run as one stack of exactly that
  length (no padding), so every sum over positions or over the batch adds the same terms
  in the same order as for the member trained alone;
- loss: :func:`dynlab.tracking.train.engine.tracker_loss` (mean cross-entropy, nats per token).
  A stack of K > 1 members runs the fused kernel on the stacked parameters
  (:func:`dynlab.tracking.train.engine.fused_loss`, one batched GEMM per step for all of them) or
  :func:`dynlab.tracking.train.engine.tracker_logits` under :func:`torch.func.vmap`; a stack of one
  runs unbatched, as the model alone;
- gradient: of the sum of the member losses (members share no parameters, so each gets its
  own), clipped to the member's ``clip`` by its own global norm (``clip_grad_norm_``);
- update: ``torch.optim.AdamW`` with one parameter group per member (the member's slices of
  the stacked tensors, its learning rate :func:`dynlab.tracking.train.engine.lr_at` and weight
  decay).  AdamW is elementwise, so this is one optimiser per member;
- divergence: a member whose loss or gradient becomes non-finite stops with
  ``status="diverged"`` (step and reason in ``reason``) and keeps its parameters from
  before that step; the others go on.

:func:`train_tracker` (one run) is an ensemble of one.  On the CPU, on the thread count
fixed by :func:`dynlab.runtime.train_threads` (one), members trained by the fused
kernels (tanh-rnn, linear-rnn, token- and state-gated RNNs) are bit-identical to the same
runs trained alone, whatever the ensemble size (tests: 16 tanh-rnn S3 members, and each
kernel at a small size).  Other cells (the :func:`torch.func.vmap` path) and CUDA agree up
to floating-point rounding (batched ops may block their sums differently).
"""

from __future__ import annotations

import copy
import time
from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.func import functional_call, stack_module_state, vmap

from dynlab.tracking.spec import RunSpec
from dynlab.tracking.groups import get_group
from dynlab.kernels.tracker_loss.dense import BUFFERS
from dynlab.tracking.models import Tracker
from dynlab.tracking.task import WordProblem
from dynlab.runtime import NullProgress, train_threads
from dynlab.tracking.train.engine import loss_of_kind, build_tracker, fused_kind, fused_loss, lr_at
from dynlab.training import TrainResult

__all__ = ["MAX_STACK", "check_ensemble", "ensemble_key", "train_ensemble", "train_tracker"]


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


def train_tracker(
    spec: RunSpec,
    device: torch.device,
    progress: NullProgress | None = None,
    *,
    threads: int | None = None,
    compile: bool = False,
) -> TrainResult:
    """Train the tracker described by ``spec`` on its word problem: an ensemble of one.

    Loss: cross-entropy of the readout against the running product at every position
    of every batch (nats per token), averaged over batch and positions.  ``threads``:
    CPU intra-op threads for the run (None: :data:`dynlab.runtime.RUN_THREADS`, the
    same on every machine, so a spec gives the same numbers wherever it runs).

    ``compile``: train with each cell's per-step ``transition`` compiled by
    ``torch.compile`` (fixed shapes: the step sees ``[B, S]`` whatever T is).  It only
    changes what runs when :func:`dynlab.tracking.train.engine.runs_generic_loop` is true (user
    cells, nonlinearities without a kernel); the fused kernels and scans do not call
    ``transition``.  Same numbers up to rounding (tested).  Off by default because it was
    slower than eager on the CPU (``docs/performance.md``); it is meant for GPUs, where it
    fuses the step's kernel launches.  The
    returned model carries no compiled functions.
    """
    return train_ensemble([spec], device, progress, threads=threads, compile=compile)[0]


def train_ensemble(
    specs: list[RunSpec],
    device: torch.device,
    progress: NullProgress | None = None,
    *,
    threads: int | None = None,
    compile: bool = False,
) -> list[TrainResult]:
    """Train the trackers of ``specs`` together; return one :class:`TrainResult` per spec.

    Every member's result equals ``train_tracker(spec, device)`` (bit for bit for the
    fused kernels on the CPU, else up to rounding); see the module docstring for how each
    piece keeps that equality.  ``threads``, ``compile``: as :func:`train_tracker`; another
    thread count than the default changes the rounding.
    """
    check_ensemble(specs)
    tasks = [WordProblem(get_group(s.task.group)) for s in specs]
    models = [build_tracker(s.model, t.n_tokens, t.n_classes, s.seed).to(device) for s, t in zip(specs, tasks)]
    template = _Loss(copy.deepcopy(models[0]))  # the members' function; their values come from the stack
    try:
        with train_threads(device, threads=threads), _compiled(template.model, compile):
            return _train(specs, tasks, models, template, device, progress or NullProgress())
    finally:
        BUFFERS.clear()  # the fused kernels' scratch buffers are not kept after training


class _Loss(nn.Module):
    """``(loss, accuracy)`` of one tracker on ``tokens, labels [B, L]`` (the engine's
    :func:`~dynlab.tracking.train.engine.tracker_loss`), as a module so that ``functional_call``
    can run it on a member's parameters."""

    def __init__(self, model: Tracker):
        super().__init__()
        self.model = model
        self.kind = fused_kind(model)  # decided once: the structure does not change while it trains

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return loss_of_kind(self.model, self.kind, tokens, labels)


def _train(specs, tasks, models, template: _Loss, device, progress) -> list[TrainResult]:
    n, trains = len(specs), [s.train for s in specs]
    results = [TrainResult(model=m) for m in models]
    gens = [torch.Generator().manual_seed(s.seed) for s in specs]
    lengths = [tr.curriculum.first_length(tr.steps) for tr in trains]  # each member's L_i
    reached: list[int | None] = [None] * n  # each member's first step at max_length (lr_at)
    params, buffers = stack_module_state([_Loss(m) for m in models])  # {name: [N, …]}
    params = {k: v.detach().clone() for k, v in params.items()}
    members = [[v[i] for v in params.values()] for i in range(n)]  # member i's slices [ …], leaf views
    opt = torch.optim.AdamW([{"params": p, "lr": tr.lr, "weight_decay": tr.weight_decay}
                             for p, tr in zip(members, trains)])  # one parameter group per member
    first = specs[0]
    label = f"{first.model.arch} {first.task.group} s{first.seed}" if n == 1 else f"ensemble {first.model.arch} ×{n}"
    bar = progress.add(f"train {label}", max(tr.steps for tr in trains))
    template.train()
    start = time.perf_counter()
    alive = list(range(n))  # members still training, in stack order
    for step in range(max(tr.steps for tr in trains)):
        alive = [i for i in alive if step < trains[i].end_step(reached[i]) and results[i].status == "ok"]
        if not alive:
            break
        for i in alive:
            if reached[i] is None and lengths[i] >= trains[i].curriculum.max_length:
                reached[i] = step
        batches = {length: _sample(tasks, gens, group, trains[0].batch_size, length, device)
                   for length, group in _by_length(alive, lengths).items()}
        losses, accs, grads = _losses_and_grads(template, params, buffers, batches, alive)  # [K] each; grads per member
        finite = torch.isfinite(losses)
        opt.zero_grad(set_to_none=True)
        for i, loss_ok in zip(alive, finite.tolist()):
            why = _clip(members[i], grads[i], trains[i].clip) if loss_ok else "loss"
            if why:  # no update: the member keeps its parameters from before this step
                results[i].diverge(why, step, lengths[i])
                for p in members[i]:
                    p.grad = None
            opt.param_groups[i]["lr"] = lr_at(trains[i], step, reached[i], lengths[i])
        opt.step()
        _record(results, trains, lengths, alive, step, losses.tolist(), accs.tolist())
        progress.update(bar, 1, K=len(alive), L=max(lengths[i] for i in alive))
    seconds = time.perf_counter() - start
    progress.remove(bar)
    for i, r in enumerate(results):
        _unstack_into(r.model, params, i)
        r.model.eval()
        r.seconds = seconds
    return results


def _clip(member: list[torch.Tensor], grads: list, clip: float) -> str:
    """Give ``member``'s parameters their gradients ``grads`` (one per parameter, None where
    the loss does not use it), clip them to global norm ``clip``; return ``"gradient"`` if
    that norm is not finite, else ``""``."""
    for p, g in zip(member, grads):
        # contiguous: a batched kernel may hand back strided gradients, and the norm's sum
        # must run in the order a model trained alone uses.
        p.grad = None if g is None else g.contiguous()
    norm = torch.nn.utils.clip_grad_norm_(member, clip)
    return "" if torch.isfinite(norm) else "gradient"


def _record(results, trains, lengths, alive, step, losses: list[float], accs: list[float]) -> None:
    """Append step ``step``'s loss and length to the results of the members still ok, then
    move their curricula on (the accuracy of this batch decides the next length)."""
    for pos, i in enumerate(alive):
        if results[i].status != "ok":
            continue
        results[i].losses.append(losses[pos])
        results[i].lengths.append(lengths[i])
        results[i].final_train_accuracy = accs[pos]
        lengths[i] = trains[i].curriculum.next_length(lengths[i], step, trains[i].steps, accs[pos])


#: Most members run through a fused kernel in one call.  A larger stack is cut into calls of
#: this many members: the per-step working set of a call (``[K, B, S]`` slices) then stays
#: in the CPU's caches, so an ensemble of 64 trains each member as fast as one of 16.
#: Members' numbers do not depend on the cut (each member's sums run over its own terms).
MAX_STACK = 16


def _losses_and_grads(template: _Loss, params: dict, buffers: dict, batches: dict, alive: list[int]):
    """Loss and accuracy ``[K]`` of the ``alive`` members (in that order) on ``batches``
    (``{length: (members, tokens, labels)}``, one stack per length, cut into calls of at
    most :data:`MAX_STACK` members for the fused kernels), from the stacked ``params`` and
    ``buffers`` ``{name: [N, …]}``, and each member's gradients ``{member: [one per
    parameter, or None]}`` of its own loss (meaningless for a member whose loss is not
    finite: the caller skips its update).

    Each call's backward pass runs before the next call's forward: the kernels' scratch
    buffers of one call are free again for the next, so an ensemble of 64 keeps the
    memory of 16, and a call's gradients are its own members' ``[K, …]`` only, so 64
    members train each about as fast as 16 (``docs/performance.md``)."""
    n = next(iter(params.values())).shape[0]
    cut = MAX_STACK if template.kind is not None else n
    names = list(params)
    losses, accs, order, grads = [], [], [], {}
    for members, tokens_all, labels_all in batches.values():
        for start in range(0, len(members), cut):
            group = members[start:start + cut]
            tokens, labels = tokens_all[start:start + cut], labels_all[start:start + cut]
            if len(group) == n:
                sub, sub_b = params, buffers
            elif group == list(range(group[0], group[0] + len(group))):  # a run of members: views, no copy
                sub, sub_b = ({k: v[group[0]:group[0] + len(group)] for k, v in d.items()} for d in (params, buffers))
            else:
                idx = torch.tensor(group, device=tokens.device)
                sub, sub_b = _rows(params, idx), _rows(buffers, idx)
            leaves = {k: v.detach().requires_grad_() for k, v in sub.items()}  # this call's own leaves
            loss, acc = _stack_loss(template, leaves, sub_b, tokens, labels)
            finite = torch.isfinite(loss)
            got = torch.autograd.grad(torch.where(finite, loss, 0.0).sum(), [leaves[k] for k in names], allow_unused=True)
            for pos, member in enumerate(group):
                grads[member] = [None if g is None else g[pos] for g in got]
            losses.append(loss.detach())
            accs.append(acc)
            order.extend(group)
    back = torch.tensor([order.index(i) for i in alive], device=losses[0].device)  # length-group order -> alive order
    return torch.cat(losses)[back], torch.cat(accs)[back], grads


def _stack_loss(template: _Loss, params: dict, buffers: dict, tokens: torch.Tensor, labels: torch.Tensor):
    """Loss and accuracy ``[K]`` of K members (``params {name: [K, …]}``) on their batches
    ``tokens, labels [K, B, L]``."""
    if tokens.shape[0] == 1:  # one member: unbatched, exactly the model trained alone
        loss, acc = functional_call(template, (_rows(params, 0), _rows(buffers, 0)), (tokens[0], labels[0]))
        return loss[None], acc[None]
    if template.kind is not None:  # the fused kernel takes the stack: one batched GEMM for all
        n = (labels >= 0).flatten(1).sum(1).clamp(min=1)  # [K] valid positions (−100 marks padding)
        stacked = {k.removeprefix("model."): v for k, v in params.items()}
        cell = template.model.cells[0]
        total, correct = fused_loss(template.kind, stacked, cell.phi, tokens, labels, cell)
        return total / n, correct.to(total.dtype).detach() / n
    return vmap(lambda p, b, t, y: functional_call(template, (p, b), (t, y)))(params, buffers, tokens, labels)


def _rows(stacked: dict, idx) -> dict:
    """Entry ``idx`` (an int: one member) or entries ``idx`` (a long tensor) of every stacked tensor."""
    if isinstance(idx, int):
        return {k: v[idx] for k, v in stacked.items()}
    return {k: v.index_select(0, idx) for k, v in stacked.items()}


def _by_length(alive: list[int], lengths: list[int]) -> dict[int, list[int]]:
    """The alive members (stack indices) by their current curriculum length."""
    out: dict[int, list[int]] = {}
    for i in alive:
        out.setdefault(lengths[i], []).append(i)
    return out


def _sample(tasks, gens, group: list[int], batch: int, length: int, device) -> tuple:
    """``(group, tokens, labels)``: the batches of the members ``group`` (all at curriculum
    length ``length``), each from the member's own generator, ``tokens, labels [K, B, length]``."""
    pairs = [tasks[i].sample(gens[i], batch, length) for i in group]
    tokens, labels = torch.stack([t for t, _ in pairs]), torch.stack([y for _, y in pairs])
    return group, tokens.to(device), labels.to(device)


def _unstack_into(model: nn.Module, params: dict, i: int) -> None:
    """Copy member ``i`` of the stacked ``params`` (names ``model.…``) into ``model``."""
    with torch.no_grad():
        own = dict(model.named_parameters())
        for k, v in params.items():
            own[k.removeprefix("model.")].copy_(v[i])


@contextmanager
def _compiled(model: Tracker, on: bool) -> Iterator[None]:
    """Within the block, every cell's ``transition`` is its ``torch.compile`` version."""
    if not on:
        yield
        return
    for cell in model.cells:
        cell.transition = torch.compile(cell.transition, dynamic=False)  # instance attribute shadows the method
    try:
        yield
    finally:
        for cell in model.cells:
            cell.__dict__.pop("transition", None)
