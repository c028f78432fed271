"""Inference streams of the trackers: a model run forward from a carried state, without
gradients, one piece of an evaluation or an analysis at a time.

- :func:`tracker_stream` — logits and final state (what :func:`dynlab.tracking.evaluate.evaluate_lengths`
  streams);
- :func:`tracker_states` — states, readout features and final state (what the analyses stream);
- :func:`tracker_features` — readout features and final state, no per-step states (the
  analyses' reference, horizon and fixed-point starts);
- :func:`diagonal_tables` — a Mamba-family cell's per-token tables over the vocabulary, the
  input of the diagonal kernels (shared with the fused training loss).

The streams equal the module's own forward (tested); for a one-layer Mamba-family tracker
on the CPU they run the compiled forward-only loop of
:func:`dynlab.kernels.tracker_loss.diagonal.diagonal_tracker_stream`.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.func import functional_call

from dynlab.kernels.tracker_loss.diagonal import compiled_loops_apply, diagonal_tracker_stream
from dynlab.tracking.models.tracker import Tracker

__all__ = ["diagonal_tables", "tracker_features", "tracker_states", "tracker_stream"]


class _Precompute(nn.Module):
    """A cell's :meth:`~dynlab.tracking.models.Cell.precompute` as ``forward`` (for ``functional_call``)."""

    def __init__(self, cell: nn.Module):
        super().__init__()
        self.cell = cell

    def forward(self, emb: torch.Tensor) -> dict[str, torch.Tensor]:
        return self.cell.precompute(emb[None])  # terms [1, V, …]


def diagonal_tables(cell: nn.Module, params: dict[str, torch.Tensor], emb: torch.Tensor) -> tuple:
    """The tables of :func:`~dynlab.kernels.tracker_loss.diagonal.diagonal_tracker_loss`: the
    cell's ``precompute`` over the vocabulary (``emb [V, D]``), turned into tables by its
    ``diagonal_tables`` (e.g. :meth:`dynlab.tracking.models.MambaCell.diagonal_tables`).

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


def _diagonal_stream(model: Tracker, tokens: torch.Tensor, state: torch.Tensor, **want: bool):
    """The compiled stream of a one-layer Mamba-family tracker on the CPU with its states
    flattened as the cell's (``[B, …, S]``), or None where it does not apply."""
    kind = model.fused_kind() if isinstance(model, Tracker) else None  # any model with the protocol streams
    if kind is None or not kind.startswith("diagonal") or not compiled_loops_apply(state) or tokens.numel() == 0:
        return None
    params = dict(model.named_parameters())
    tables = diagonal_tables(model.cells[0], params, params["embed.weight"])
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

    For a one-layer Mamba-family tracker (:meth:`Tracker.fused_kind` ``diagonal…``) on the CPU with
    the compiled loops available, the cell's per-token tables (its own ``precompute``
    over the vocabulary) are run by
    :func:`dynlab.kernels.tracker_loss.diagonal.diagonal_tracker_stream`, one sequence at a time
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


@torch.no_grad()
def tracker_features(
    model: Tracker, tokens: torch.Tensor, state: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """``(features [B, T, F], final [B, S])`` of ``model`` on ``tokens`` from ``state``,
    without gradients: ``model(tokens, state, return_states=False, return_features=True)``'s
    readout features and final state.  The Mamba-family trackers on the CPU run the compiled
    stream of :func:`tracker_stream` (no per-step states or logits formed)."""
    if state is None:
        state = model.init_state(tokens.shape[0], device=tokens.device)
    out = _diagonal_stream(model, tokens, state, logits=False, states=False, features=True)
    if out is None:
        res = model(tokens, state, return_states=False, return_features=True)
        return res.features, res.final_state
    return out.features, out.final
