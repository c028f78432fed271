"""What training is made of: the result, the model, the loss, the schedule, the threads.

The training loop itself is :func:`dynlab.train.ensemble.train_ensemble` (N trackers as one
stack; :func:`dynlab.train.ensemble.train_tracker` is an ensemble of one); the LM loop
(:func:`dynlab.lm.train.fit`) uses the same :class:`TrainResult`, :func:`cosine_lr`,
:func:`train_threads` and divergence rule.  One code path for the CPU and CUDA.  Reruns
with the same spec are bit-identical on the CPU: the model is initialised inside a forked
RNG scope seeded from the spec (no global state leaks out), every batch comes from an
explicit ``torch.Generator`` and the thread count is fixed (:data:`RUN_THREADS`).
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
from torch.func import functional_call

from dynlab.config import ModelSpec, TrainSpec
from dynlab.kernels.dense_tracker import dense_tracker_loss
from dynlab.kernels.diagonal_tracker import compiled_loops_apply, diagonal_tracker_loss, diagonal_tracker_stream
from dynlab.kernels.gated_tracker import gated_tracker_loss
from dynlab.models import Tracker
from dynlab.models.cells import FUSED_KERNELS
from dynlab.train.device import keep_freed_memory

__all__ = [
    "MAX_THREADS",
    "RUN_THREADS",
    "TrainResult",
    "build_tracker",
    "cosine_lr",
    "fused_kind",
    "fused_loss",
    "lr_at",
    "runs_generic_loop",
    "tracker_logits",
    "tracker_loss",
    "tracker_states",
    "tracker_stream",
    "train_threads",
]

#: CPU intra-op threads of every run (training, evaluation, analyses), whatever the
#: machine, the ensemble size or the executor.  The thread count changes how GEMMs and
#: reductions block their sums, hence the rounding, so a count taken from the machine
#: (``torch.get_num_threads()``) or from the size of an ensemble would make the same spec
#: give different numbers in different places.  One thread is also the fast choice at
#: dynlab's sizes (``docs/performance.md``).  Use more cores by running several runs at
#: once (``--executor dask --workers N``).
RUN_THREADS = 1

#: Largest thread count :func:`train_threads` accepts.
MAX_THREADS = 1024


@dataclass
class TrainResult:
    """Outcome of training one model (a tracker, or an LM in :func:`dynlab.lm.train.fit`).

    Attributes:
        model: the trained model (on the training device).
        status: ``"ok"`` or ``"diverged"``.
        reason: why a run failed (empty when ok), e.g. ``"non-finite loss at step 3 (length 9)"``.
        losses: mean cross-entropy of each completed step (nats per token); a diverged
            run stops before recording the failing step, so every entry is finite.
        lengths: sequence length of each completed step (for trackers the curriculum
            length; ``lengths[-1]`` is the length reached, ``curriculum_length`` in datasets).
        final_train_accuracy: per-token accuracy of the last training batch (NaN when the
            loop does not measure it, as the LM loop).
        seconds: wall time of the training loop (for an ensemble, of the whole stack).
    """

    model: nn.Module
    status: str = "ok"
    reason: str = ""
    losses: list[float] = field(default_factory=list)
    lengths: list[int] = field(default_factory=list)
    final_train_accuracy: float = float("nan")
    seconds: float = 0.0

    def diverge(self, what: str, step: int, length: int) -> None:
        """Mark the run diverged: its ``what`` (``"loss"`` or ``"gradient"``) became
        non-finite at ``step`` (0-based), on a batch of sequence length ``length``.  The
        loop then stops the run without applying that step."""
        self.status, self.reason = "diverged", f"non-finite {what} at step {step} (length {length})"


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
    :func:`dynlab.kernels.dense_tracker.dense_tracker_loss` (``kind == "dense"``),
    :func:`dynlab.kernels.gated_tracker.gated_tracker_loss` (the gated kinds) or
    :func:`dynlab.kernels.diagonal_tracker.diagonal_tracker_loss` (``"diagonal"``, whose
    tables are the terms of ``cell``'s own ``precompute`` over the vocabulary: ``cell``,
    the tracker's first cell, is required for it and only its structure is used).
    """
    emb = params["embed.weight"]  # [V, D] or [N, V, D]
    W, c = params["readout.weight"], params["readout.bias"]
    if kind.startswith("diagonal"):
        if cell is None:
            raise ValueError("the diagonal kernel needs the cell whose precompute forms its tables; got cell=None")
        return diagonal_tracker_loss(tokens, labels, *_diagonal_tables(cell, params, emb), W, c)

    def table(layer: str) -> torch.Tensor:  # emb @ Wᵀ + b: [V, S] or [N, V, S]
        return torch.matmul(emb, params[f"{layer}.weight"].mT) + params[f"{layer}.bias"].unsqueeze(-2)

    drive, A = table("cells.0.B"), params["cells.0.A"]
    if kind == "dense":
        return dense_tracker_loss(tokens, labels, drive, A, W, c, phi)
    if kind in ("token-gated", "state-gated"):
        U = params["cells.0.U_g"] if kind == "state-gated" else None
        return gated_tracker_loss(tokens, labels, drive, table("cells.0.W_g"), A, U, W, c, phi)
    raise ValueError(f"unknown fused kernel kind {kind!r}; allowed: {', '.join(FUSED_KERNELS)}")


class _Precompute(nn.Module):
    """A cell's :meth:`~dynlab.models.Cell.precompute` as ``forward`` (for ``functional_call``)."""

    def __init__(self, cell: nn.Module):
        super().__init__()
        self.cell = cell

    def forward(self, emb: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.cell.precompute(emb[None])  # terms [1, V, …]


def _diagonal_tables(cell: nn.Module, params: dict[str, torch.Tensor], emb: torch.Tensor) -> tuple:
    """The tables of :func:`~dynlab.kernels.diagonal_tracker.diagonal_tracker_loss`: the
    cell's ``precompute`` over the vocabulary (``emb [V, D]``), turned into tables by its
    ``diagonal_tables`` (e.g. :meth:`dynlab.models.MambaCell.diagonal_tables`).

    Stacked ``params`` (``emb [N, V, D]``) run the unbatched functions on each member's
    slices (``unbind``, whose backward stacks the members' gradients): the same operations
    as for the member alone, so an ensemble member's gradients are bit-identical to solo
    training's (a ``vmap`` would batch the products and round differently)."""
    own = {k.removeprefix("cells.0."): v for k, v in params.items() if k.startswith("cells.0.")}
    module = _Precompute(cell)

    def one(p: dict[str, torch.Tensor], e: torch.Tensor) -> tuple:
        terms = functional_call(module, {f"cell.{k}": v for k, v in p.items()}, (e,))
        return cell.diagonal_tables({k: v[0] for k, v in terms.items()}, p)

    if emb.dim() == 2:
        return one(own, emb)
    names = list(own)
    per = [one(dict(zip(names, values)), e) for *values, e in zip(*(own[k].unbind(0) for k in names), emb.unbind(0))]
    return tuple(torch.stack(parts) for parts in zip(*per))


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


def _diagonal_stream(model: Tracker, tokens: torch.Tensor, state: torch.Tensor, **want: bool):
    """The compiled stream of a one-layer Mamba-family tracker on the CPU with its states
    flattened as the cell's (``[B, …, S]``), or None where it does not apply."""
    kind = fused_kind(model) if isinstance(model, Tracker) else None  # any model with the protocol streams
    if kind is None or not kind.startswith("diagonal") or not compiled_loops_apply(state) or tokens.numel() == 0:
        return None
    params = dict(model.named_parameters())
    tables = _diagonal_tables(model.cells[0], params, params["embed.weight"])
    a = tables[0]
    bsz = tokens.shape[0]
    if a.is_complex():  # the cell's flat state holds (re, im) pairs per channel
        h0 = torch.view_as_complex(state.reshape(bsz, -1, 2).contiguous())
    else:
        h0 = state.reshape(bsz, *a.shape[1:])  # [B, H, K]: the cell's layout

    def flat(x: torch.Tensor | None, lead: int) -> torch.Tensor | None:
        if x is None:
            return None
        x = torch.view_as_real(x) if x.is_complex() else x
        return x.reshape(*x.shape[:lead], -1).to(state.dtype)

    out = diagonal_tracker_stream(tokens, *tables, params["readout.weight"], params["readout.bias"], h0, **want)
    return out._replace(states=flat(out.states, 2), final=flat(out.final, 1))


@torch.no_grad()
def tracker_stream(model: Tracker, tokens: torch.Tensor, state: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``model(tokens, state)``'s logits ``[B, T, C]`` and final state ``[B, S]``, without
    gradients: one piece of an evaluation stream.

    For a one-layer Mamba-family tracker (:func:`fused_kind` ``diagonal…``) on the CPU with
    the compiled loops available, the cell's per-token tables (its own ``precompute``
    over the vocabulary) are run by
    :func:`dynlab.kernels.diagonal_tracker.diagonal_tracker_stream`, one sequence at a time
    with its state in cache: no ``[B, T, S]`` states, gates or decays are formed.  The
    same function as the module's forward (a test compares logits and final states); every
    other model runs its forward.
    """
    if state is None:
        state = model.init_state(tokens.shape[0], device=tokens.device)
    out = _diagonal_stream(model, tokens, state)
    if out is None:
        res = model(tokens, state)
        return res.logits, res.final_state
    return out.logits, out.final


@torch.no_grad()
def tracker_states(
    model: Tracker, tokens: torch.Tensor, state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """``(states [B, T, S], features [B, T, F], final [B, S])`` of ``model`` on ``tokens``
    from ``state``, without gradients: ``model(tokens, state, return_states=True,
    return_features=True)``'s states, readout features and final state, as the analyses
    stream them.  The Mamba-family trackers on the CPU run the compiled stream of
    :func:`tracker_stream` (the states written in the cell's layout, no logits)."""
    if state is None:
        state = model.init_state(tokens.shape[0], device=tokens.device)
    out = _diagonal_stream(model, tokens, state, logits=False, states=True, features=True)
    if out is None:
        res = model(tokens, state, return_states=True, return_features=True)
        return res.states, res.features, res.final_state
    return out.states, out.features, out.final


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
    keep_freed_memory()  # once per process: freed activations are reused, not faulted in again
    old = torch.get_num_threads()
    if want == old:
        yield old
        return
    torch.set_num_threads(want)
    try:
        yield want
    finally:
        torch.set_num_threads(old)


def cosine_lr(lr: float, step: int, steps: int, warmup: int, *, start: int | None = None, floor: float = 0.0) -> float:
    """Learning rate of ``step`` (0-based) of a run of ``steps``: linear warm-up
    ``lr·(step + 1)/warmup`` over the first ``warmup`` steps, then cosine decay from ``lr``
    at ``start`` (None: ``warmup``) to ``floor·lr`` at ``steps``.  The tracker schedules
    (:func:`lr_at`) decay to 0; the LM loop to ``floor = 0.1``."""
    if step < warmup:
        return lr * (step + 1) / warmup
    start = warmup if start is None else start
    cos = math.cos(math.pi * (step - start) / max(1, steps - start))
    return floor * lr + (1 - floor) * 0.5 * lr * (1 + cos)  # floor 0: 0.5·lr·(1 + cos), rounded as before


def lr_at(train: TrainSpec, step: int, reached: int | None = None) -> float:
    """Learning rate of ``step``: :func:`cosine_lr` with ``warmup_steps``, decaying to 0 at
    ``steps`` from the end of the warm-up (``schedule="cosine"``) or, with
    ``schedule="curriculum"``, from ``reached``, the first step whose batch had the
    curriculum's ``max_length`` (None = not reached yet: after the warm-up the rate stays at ``lr``)."""
    if train.schedule == "cosine" or step < train.warmup_steps:
        return cosine_lr(train.lr, step, train.steps, train.warmup_steps)
    if reached is None:
        return train.lr
    return cosine_lr(train.lr, step, train.steps, train.warmup_steps, start=max(train.warmup_steps, reached))
