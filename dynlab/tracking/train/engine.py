"""What training is made of: the result, the model, the loss, the schedule.

The training loop itself is :func:`dynlab.tracking.train.ensemble.train_ensemble` (N trackers as one
stack; :func:`dynlab.tracking.train.ensemble.train_tracker` is an ensemble of one); the LM loop
(:func:`dynlab.lm.train.engine.fit`) uses the same :class:`TrainResult`, :func:`cosine_lr`,
:func:`dynlab.runtime.train_threads` and divergence rule.  One code path for the CPU and CUDA.  Reruns
with the same spec are bit-identical on the CPU: the model is initialised inside a forked
RNG scope seeded from the spec (no global state leaks out), every batch comes from an
explicit ``torch.Generator`` and the thread count is fixed (:data:`dynlab.runtime.RUN_THREADS`).
A run whose loss or gradient becomes non-finite is stopped and reported as
``status="diverged"`` with the step and reason; the caller records it and goes on.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from dynlab.tracking.spec import ModelSpec, TrainSpec
from dynlab.kernels.tracker_loss.dense import dense_tracker_loss
from dynlab.kernels.tracker_loss.diagonal import diagonal_tracker_loss
from dynlab.kernels.tracker_loss.gated import gated_tracker_loss
from dynlab.tracking.models import Tracker
from dynlab.tracking.models.cell_base import FUSED_KERNELS
from dynlab.tracking.models.streams import diagonal_tables
from dynlab.runtime import train_threads
from dynlab.training import TrainResult, cosine_lr

__all__ = [
    "TrainResult",
    "build_tracker",
    "cosine_lr",
    "fused_kind",
    "fused_loss",
    "lr_at",
    "runs_generic_loop",
    "tracker_logits",
    "tracker_loss",
]

def build_tracker(model: ModelSpec, n_tokens: int, n_classes: int, seed: int) -> Tracker:
    """Build a tracker (on the CPU) with parameters drawn from ``seed`` only (global RNG
    untouched), on :data:`dynlab.runtime.RUN_THREADS` threads whatever the caller's count: some
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
    ``"state-gated"``), or None: :meth:`dynlab.tracking.models.Tracker.fused_kind`, decided by the
    class attributes ``Tracker.fused_ok`` and ``Cell.fused`` (which a subclass that
    overrides a method loses) and the instance's phi and parameters."""
    return model.fused_kind()


def runs_generic_loop(model: Tracker) -> bool:
    """True when training ``model`` runs some cell's per-step loop over ``transition`` (no
    fused kernel for the model, and a cell without ``fast_scan_ok``): the only case in
    which ``train_tracker(..., compile=True)`` changes what runs."""
    return fused_kind(model) is None and any(not cell.fast_scan_ok() for cell in model.cells)


def fused_loss(
    kind: str,
    params: dict[str, torch.Tensor],
    phi: str,
    tokens: torch.Tensor,
    labels: torch.Tensor,
    cell: nn.Module | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy and hit count of a :func:`fused_kind` tracker from its
    parameters ``params`` (names as in ``Tracker.named_parameters()``; each ``[…]`` for
    one model with ``tokens [B, T]``, or ``[N, …]`` stacked with ``tokens [N, B, T]``).

    The per-token tables (embedding through the input projections) are formed here under
    autograd; the recurrence, readout and loss run in
    :func:`dynlab.kernels.tracker_loss.dense.dense_tracker_loss` (``kind == "dense"``),
    :func:`dynlab.kernels.tracker_loss.gated.gated_tracker_loss` (the gated kinds) or
    :func:`dynlab.kernels.tracker_loss.diagonal.diagonal_tracker_loss` (``"diagonal"``, whose
    tables are the terms of ``cell``'s own ``precompute`` over the vocabulary: ``cell``,
    the tracker's first cell, is required for it and only its structure is used).
    """
    emb = params["embed.weight"]  # [V, D] or [N, V, D]
    W, c = params["readout.weight"], params["readout.bias"]
    if kind.startswith("diagonal"):
        if cell is None:
            raise ValueError("the diagonal kernel needs the cell whose precompute forms its tables; got cell=None")
        return diagonal_tracker_loss(tokens, labels, *diagonal_tables(cell, params, emb), W, c)

    def table(layer: str) -> torch.Tensor:  # emb @ Wᵀ + b: [V, S] or [N, V, S]
        return torch.matmul(emb, params[f"{layer}.weight"].mT) + params[f"{layer}.bias"].unsqueeze(-2)

    drive, A = table("cells.0.B"), params["cells.0.A"]
    if kind == "dense":
        return dense_tracker_loss(tokens, labels, drive, A, W, c, phi)
    if kind in ("token-gated", "state-gated"):
        U = params["cells.0.U_g"] if kind == "state-gated" else None
        return gated_tracker_loss(tokens, labels, drive, table("cells.0.W_g"), A, U, W, c, phi)
    raise ValueError(f"unknown fused kernel kind {kind!r}; allowed: {', '.join(FUSED_KERNELS)}")


def tracker_loss(model: Tracker, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Training loss and accuracy of ``model`` on ``tokens [B, T]`` against ``labels [B, T]``.

    Returns ``(loss, accuracy)``: the mean cross-entropy over the valid positions (labels
    other than −100; nats per token, differentiable) and the fraction of valid positions
    whose argmax logit is the label (no gradient).  Equal to
    ``F.cross_entropy(tracker_logits(model, tokens), labels)`` (a test checks value and
    gradients); for the models of :func:`fused_kind` it runs a fused kernel
    (:func:`fused_loss`), otherwise that expression.
    """
    return loss_of_kind(model, fused_kind(model), tokens, labels)


def loss_of_kind(model: Tracker, kind: str | None, tokens: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`tracker_loss` with ``fused_kind(model)`` already known (a training loop asks once)."""
    valid = labels >= 0  # −100 (cross_entropy's ignore_index) marks padding
    n = valid.sum().clamp(min=1)
    if kind is not None:
        params = dict(model.named_parameters())
        total, correct = fused_loss(kind, params, model.cells[0].phi, tokens, labels, model.cells[0])
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


def lr_at(train: TrainSpec, step: int, reached: int | None = None, length: int | None = None) -> float:
    """Learning rate of ``step``: :func:`cosine_lr` with ``warmup_steps``, decaying to 0 at
    ``steps`` from the end of the warm-up (``schedule="cosine"``) or, with
    ``schedule="curriculum"``, from ``reached``, the first step whose batch had the
    curriculum's ``max_length`` (None = not reached yet: after the warm-up the rate stays at ``lr``).
    With ``tail_steps`` the decay ends at :meth:`~dynlab.tracking.spec.TrainSpec.end_step`, where the run stops.
    With ``lr_length`` and the step's batch ``length`` > ``lr_length``, times ``lr_length / length``."""
    return _base_lr(train, step, reached) * length_factor(train, length)


def length_factor(train: TrainSpec, length: int | None) -> float:
    """``lr_length / length`` when ``train.lr_length`` is set and ``length`` exceeds it, else 1."""
    if train.lr_length is None or length is None or length <= train.lr_length:
        return 1.0
    return train.lr_length / length


def _base_lr(train: TrainSpec, step: int, reached: int | None) -> float:
    if train.schedule == "cosine" or step < train.warmup_steps:
        return cosine_lr(train.lr, step, train.steps, train.warmup_steps)
    if reached is None:
        return train.lr
    return cosine_lr(train.lr, step, train.end_step(reached), train.warmup_steps, start=max(train.warmup_steps, reached))
