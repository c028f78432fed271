"""The training engine for state trackers: curriculum, AdamW, clipping, explicit seeds.

One code path for the CPU and CUDA.  Reruns with the same spec are bit-identical on the
CPU: the model is initialised inside a forked RNG scope seeded from the spec (no global
state leaks out) and every batch comes from an explicit ``torch.Generator``.
A run whose loss or gradient becomes non-finite is stopped and reported as
``status="diverged"`` with the step and reason; the caller records it and goes on.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.config import ModelSpec, RunSpec, TrainSpec
from dynlab.groups import get_group
from dynlab.kernels.dense_tracker import BUFFERS, dense_tracker_loss
from dynlab.kernels.gated_tracker import gated_tracker_loss
from dynlab.models import Tracker
from dynlab.tasks import WordProblem
from dynlab.train.progress import NullProgress

__all__ = [
    "MAX_THREADS",
    "RUN_THREADS",
    "TrainResult",
    "build_tracker",
    "fused_kind",
    "fused_loss",
    "lr_at",
    "runs_generic_loop",
    "tracker_logits",
    "tracker_loss",
    "train_threads",
    "train_tracker",
]

#: CPU intra-op threads of every run (training, evaluation, analyses), whatever the
#: machine, the ensemble size or the executor.  The thread count changes how GEMMs and
#: reductions block their sums, hence the rounding, so a count taken from the machine
#: (``torch.get_num_threads()``) or from the size of an ensemble would make the same spec
#: give different numbers in different places.  One thread is also the fast choice at
#: dynlab's sizes (measured on the shared 2-core box at H=64, B=128: a tanh-rnn step took
#: 11 ms on 1 thread and 740 ms on 2 with the cores oversubscribed; a mamba step 31 ms vs
#: 52 ms).  Use more cores by running several runs at once (``--executor dask --workers N``).
RUN_THREADS = 1

#: Largest thread count :func:`train_threads` accepts.
MAX_THREADS = 1024


@dataclass
class TrainResult:
    """Outcome of training one tracker.

    Attributes:
        model: the trained tracker (on the training device).
        status: ``"ok"`` or ``"diverged"``.
        reason: why a run failed (empty when ok).
        losses: mean cross-entropy per step (nats per token).
        lengths: curriculum length used at each step.
        final_train_accuracy: per-token accuracy of the last training batch.

    ``lengths[-1]`` is the curriculum length reached (``curriculum_length`` in datasets).
    """

    model: Tracker
    status: str = "ok"
    reason: str = ""
    losses: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    final_train_accuracy: float = float("nan")


def build_tracker(model: ModelSpec, n_tokens: int, n_classes: int, seed: int) -> Tracker:
    """Build a tracker (on the CPU) with parameters drawn from ``seed`` only (global RNG
    untouched), on :data:`RUN_THREADS` threads whatever the caller's count: some
    initialisations (``nn.init.orthogonal_``, a QR factorisation) round differently on
    different thread counts."""
    with torch.random.fork_rng(devices=[]), train_threads("cpu"):
        torch.manual_seed(seed)
        return Tracker(
            model.arch,
            n_tokens,
            n_classes,
            hidden=model.hidden,
            layers=model.layers,
            nonlinearity=model.nonlinearity,
            d_embed=model.d_embed,
            d_state=model.d_state,
            readout=model.readout,
        )


def fused_kind(model: Tracker) -> str | None:
    """The fused training kernel for ``model`` (``"dense"``, ``"token-gated"``,
    ``"state-gated"``), or None: :meth:`dynlab.models.Tracker.fused_kind`, decided by the
    class attributes ``Tracker.fused_ok`` and ``Cell.fused`` (which a subclass that
    overrides a method loses) and the instance's phi and parameters."""
    return model.fused_kind()


def runs_generic_loop(model: Tracker) -> bool:
    """True when training ``model`` runs some cell's per-step loop over ``transition`` (no
    fused kernel for the model, and a cell without ``fast_scan_ok``): the only case in
    which ``train_tracker(..., compile=True)`` changes what runs."""
    return fused_kind(model) is None and any(not cell.fast_scan_ok() for cell in model.cells)


def fused_loss(
    kind: str, params: dict[str, torch.Tensor], phi: str, tokens: torch.Tensor, labels: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy and hit count of a :func:`fused_kind` tracker from its
    parameters ``params`` (names as in ``Tracker.named_parameters()``; each ``[…]`` for
    one model with ``tokens [B, T]``, or ``[N, …]`` stacked with ``tokens [N, B, T]``).

    The per-token tables (embedding through the input projections) are formed here under
    autograd; the recurrence, readout and loss run in
    :func:`dynlab.kernels.dense_tracker.dense_tracker_loss` (``kind == "dense"``) or
    :func:`dynlab.kernels.gated_tracker.gated_tracker_loss`.
    """
    emb = params["embed.weight"]  # [V, D] or [N, V, D]

    def table(layer: str) -> torch.Tensor:  # emb @ Wᵀ + b: [V, S] or [N, V, S]
        return torch.matmul(emb, params[f"{layer}.weight"].mT) + params[f"{layer}.bias"].unsqueeze(-2)

    drive, A = table("cells.0.B"), params["cells.0.A"]
    W, c = params["readout.weight"], params["readout.bias"]
    if kind == "dense":
        return dense_tracker_loss(tokens, labels, drive, A, W, c, phi)
    if kind in ("token-gated", "state-gated"):
        U = params["cells.0.U_g"] if kind == "state-gated" else None
        return gated_tracker_loss(tokens, labels, drive, table("cells.0.W_g"), A, U, W, c, phi)
    raise ValueError(f"unknown fused kernel kind {kind!r}; allowed: dense, token-gated, state-gated")


def tracker_loss(model: Tracker, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Training loss and accuracy of ``model`` on ``tokens [B, T]`` against ``labels [B, T]``.

    Returns ``(loss, accuracy)``: the mean cross-entropy over the valid positions (labels
    other than −100; nats per token, differentiable) and the fraction of valid positions
    whose argmax logit is the label (no gradient).  Equal to
    ``F.cross_entropy(tracker_logits(model, tokens), labels)`` (a test checks value and
    gradients); for the models of :func:`fused_kind` it runs a fused kernel
    (:func:`fused_loss`), otherwise that expression.
    """
    return _loss(model, fused_kind(model), tokens, labels)


def _loss(model: Tracker, kind: str | None, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tracker_loss` with ``fused_kind(model)`` already known (a training loop asks once)."""
    valid = labels >= 0  # −100 (cross_entropy's ignore_index) marks padding
    n = valid.sum().clamp(min=1)
    if kind is not None:
        total, correct = fused_loss(kind, dict(model.named_parameters()), model.cells[0].phi, tokens, labels)
        return total / n, correct.to(total.dtype).detach() / n
    logits = tracker_logits(model, tokens)  # [B, T, C]
    loss = F.cross_entropy(logits.flatten(0, 1), labels.flatten())
    hits = ((logits.detach().argmax(-1) == labels) & valid).sum()
    return loss, hits.to(logits.dtype) / n


def tracker_logits(model: Tracker, tokens: torch.Tensor) -> torch.Tensor:
    """Logits ``[B, T, C]`` of ``model`` on ``tokens [B, T]`` from the zero state.

    The same function as ``model(tokens).logits`` (a test checks it), organised for training speed: when the
    first cell's precompute is pointwise in time (``Cell.pointwise_precompute``), its terms
    are computed once per vocabulary entry (``[V, …]``) and gathered by token, in
    time-major storage ``[T, B, …]`` (exposed as ``[B, T, …]`` views), so the input
    projection costs O(V) GEMM rows instead of O(B·T) and the scans read contiguous
    steps.  The readout runs on time-major rows as well.
    """
    first = model.cells[0]
    emb = model.embed
    if first.pointwise_precompute and isinstance(emb, nn.Embedding) and emb.max_norm is None:
        table = first.precompute(emb.weight[None])  # terms [1, V, …]
        tok_tm = tokens.transpose(0, 1)  # [T, B]
        flat = tok_tm.reshape(-1)
        # index_select, not v[0][tok_tm]: its backward is one index_add_, about 2× faster than
        # the accumulate-index_put of advanced indexing (measured, [V=6, S=512] rows, T·B=15360).
        p = {k: torch.index_select(v[0], 0, flat).view(*tok_tm.shape, *v.shape[2:]).transpose(0, 1) for k, v in table.items()}
    else:
        p = first.precompute(emb(tokens))
    h0s = model._split(model.init_state(tokens.shape[0], device=tokens.device))  # zero state, as forward
    u = first.readout(first.scan(h0s[0], p), p)  # [B, T, O]
    for cell, h0 in zip(model.cells[1:], h0s[1:]):
        u, _ = cell(u, h0)
    return model.readout(u.transpose(0, 1)).transpose(0, 1)  # [B, T, C]


@contextmanager
def train_threads(device: torch.device | str, *, threads: int | None = None) -> Iterator[int]:
    """Run the block with ``threads`` CPU intra-op threads (None: :data:`RUN_THREADS`).

    The default does not depend on the machine or on the work, so a run's numbers do not
    either (see :data:`RUN_THREADS`); an explicit count is for speed measurements and
    changes the rounding.  Yields the thread count in effect and restores the previous
    count afterwards.  On other devices the CPU count is set as well (host-side ops).
    """
    if threads is not None and not (isinstance(threads, int) and 1 <= threads <= MAX_THREADS):
        raise ValueError(f"threads must be an integer in 1..{MAX_THREADS} or None, got {threads!r}")
    torch.device(device)  # refuse a malformed device
    want = RUN_THREADS if threads is None else threads
    old = torch.get_num_threads()
    if want == old:
        yield old
        return
    torch.set_num_threads(want)
    try:
        yield want
    finally:
        torch.set_num_threads(old)


def lr_at(train: TrainSpec, step: int, reached: int | None = None) -> float:
    """Learning rate of ``step``: linear warm-up for ``warmup_steps``, then cosine decay
    to 0 at ``steps``, starting at the end of the warm-up (``schedule="cosine"``) or, with
    ``schedule="curriculum"``, at ``reached``, the first step whose batch had the
    curriculum's ``max_length`` (None = not reached yet: the rate stays at ``lr``)."""
    if step < train.warmup_steps:
        return train.lr * (step + 1) / train.warmup_steps
    start = train.warmup_steps
    if train.schedule == "curriculum":
        if reached is None:
            return train.lr
        start = max(start, reached)
    span = max(1, train.steps - start)
    return 0.5 * train.lr * (1 + math.cos(math.pi * (step - start) / span))


def train_tracker(
    spec: RunSpec,
    device: torch.device,
    progress: NullProgress | None = None,
    *,
    threads: int | None = None,
    compile: bool = False,
) -> TrainResult:
    """Train the tracker described by ``spec`` on its word problem.

    Loss: cross-entropy of the readout against the running product at every position
    of every batch (nats per token), averaged over batch and positions.  ``threads``:
    CPU intra-op threads for the run (None: :data:`RUN_THREADS`, the same on every machine,
    so a spec gives the same numbers wherever it runs; see :func:`train_threads`).

    ``compile``: train with each cell's per-step ``transition`` compiled by
    ``torch.compile`` (fixed shapes, so one compilation per curriculum length is not
    needed: the step sees ``[B, S]`` whatever T is).  It only changes what runs when
    :func:`runs_generic_loop` is true (user cells, nonlinearities without a kernel); the
    fused kernels and scans do not call ``transition``.  Same numbers up to rounding
    (tested).  Measured on the 2-core CPU box, state-gated-rnn through the
    generic loop (H=128, B=256, T=60): forward and backward took 105 ms compiled vs
    80 ms eager, after 23 s of compilation, so it is off by default; it is meant for
    GPUs, where it fuses the step's kernel launches.
    The compiled functions are removed from the cells when training ends.
    """
    progress = progress or NullProgress()
    task = WordProblem(get_group(spec.task.group))
    model = build_tracker(spec.model, task.n_tokens, task.n_classes, spec.seed).to(device)
    try:
        with train_threads(device, threads=threads), _compiled(model, compile):
            return _train(spec, task, model, device, progress)
    finally:
        BUFFERS.clear()  # the fused kernels' scratch buffers are not kept after training


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


def _train(
    spec: RunSpec, task: WordProblem, model: Tracker, device: torch.device, progress: NullProgress
) -> TrainResult:
    tr = spec.train
    opt = torch.optim.AdamW(model.parameters(), lr=tr.lr, weight_decay=tr.weight_decay)
    gen = torch.Generator().manual_seed(spec.seed)
    result = TrainResult(model=model)
    kind = fused_kind(model)  # decided once: the model's structure does not change while it trains
    bar = progress.add(f"train {spec.model.arch} {spec.task.group} s{spec.seed}", tr.steps)
    model.train()
    length = tr.curriculum.first_length(tr.steps)
    reached: int | None = None  # first step at the curriculum's max_length (lr_at)
    for step in range(tr.steps):
        if reached is None and length >= tr.curriculum.max_length:
            reached = step
        tokens, labels = task.sample(gen, tr.batch_size, length)
        tokens, labels = tokens.to(device), labels.to(device)
        for g in opt.param_groups:
            g["lr"] = lr_at(tr, step, reached)
        loss, acc_t = _loss(model, kind, tokens, labels)
        if not torch.isfinite(loss):
            result.status, result.reason = "diverged", f"non-finite loss at step {step} (length {length})"
            break
        opt.zero_grad(set_to_none=True)
        loss.backward()
        gnorm = torch.nn.utils.clip_grad_norm_(model.parameters(), tr.clip)
        if not torch.isfinite(gnorm):
            result.status, result.reason = "diverged", f"non-finite gradient at step {step} (length {length})"
            break
        opt.step()
        lval = float(loss.detach())
        result.losses.append(lval)
        result.lengths.append(length)
        acc = float(acc_t)
        result.final_train_accuracy = acc
        progress.update(bar, 1, loss=lval, L=length)
        length = tr.curriculum.next_length(length, step, tr.steps, acc)
    progress.remove(bar)
    model.eval()
    return result
