"""The state tracker: token embedding → stacked recurrent cells → per-step readout."""

from __future__ import annotations

from typing import ClassVar, NamedTuple

import torch
from torch import nn

from dynlab.errors import DynlabInputError
from dynlab.tracking.models.cell_base import FUSED_KERNEL_PHIS, overridden_methods
from dynlab.tracking.models.registry import get_cell

__all__ = ["Tracker", "TrackerOutput", "declared_fused_kind"]


class TrackerOutput(NamedTuple):
    logits: torch.Tensor  # [B, T, C]
    final_state: torch.Tensor  # [B, S]
    states: torch.Tensor | None  # [B, T, S] when asked for
    features: torch.Tensor | None = None  # [B, T, F] input of the final linear readout layer, when asked for


class Tracker(nn.Module):
    """A stack of ``layers`` cells of architecture ``arch`` with a readout at every step.

    The recurrent state of all layers is one flat vector ``[B, S]`` (layer after layer);
    :meth:`layer_slice` gives each layer's coordinates.  The readout maps the last
    layer's output to ``n_classes`` logits (linear, or a one-hidden-layer MLP).

    Args:
        arch: registered cell name (see :func:`dynlab.tracking.models.available_cells`).
        n_tokens: vocabulary size (group order for word problems).
        n_classes: readout classes.
        hidden: cell width.
        layers: number of stacked cells.
        nonlinearity: phi for every cell (None = the cell's default).
        d_embed: token embedding width (default ``hidden``).
        d_state: states per channel for Mamba-style cells.
        readout: ``"linear"`` or ``"mlp"``.

    Class attribute ``fused_ok``: the fused training kernels may compute this tracker's
    loss (:meth:`fused_kind`).  A subclass that overrides any method loses it (False)
    unless its class body declares it again, as cells lose ``fused``
    (:mod:`dynlab.tracking.models.cell_base`).

    Return order (:mod:`dynlab.tracking.models.cell_base`): outputs first, state second.
    """

    fused_ok: ClassVar[bool] = True

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        if "fused_ok" not in vars(cls) and overridden_methods(cls):
            cls.fused_ok = False

    def __init__(
        self,
        arch: str,
        n_tokens: int,
        n_classes: int,
        hidden: int = 64,
        layers: int = 1,
        nonlinearity: str | None = None,
        d_embed: int | None = None,
        d_state: int = 4,
        readout: str = "linear",
    ):
        super().__init__()
        cell_cls = get_cell(arch)
        self.arch = arch
        self.n_tokens = n_tokens
        self.n_classes = n_classes
        d_embed = d_embed or hidden
        self.embed = nn.Embedding(n_tokens, d_embed)
        cells = []
        d_in = d_embed
        for _ in range(layers):
            cell = cell_cls(d_in, hidden, nonlinearity=nonlinearity, d_state=d_state)
            cells.append(cell)
            d_in = cell.out_size
        self.cells = nn.ModuleList(cells)
        if readout == "linear":
            self.readout = nn.Linear(d_in, n_classes)
        elif readout == "mlp":
            self.readout = nn.Sequential(nn.Linear(d_in, 2 * d_in), nn.GELU(), nn.Linear(2 * d_in, n_classes))
        else:
            raise DynlabInputError(f"unknown readout {readout!r}; allowed: linear, mlp")
        bounds = [0]
        for cell in self.cells:
            bounds.append(bounds[-1] + cell.state_size)
        self._bounds = bounds

    @property
    def state_size(self) -> int:
        return self._bounds[-1]

    @property
    def family(self) -> str:
        """Declared family of the whole stack: affine only if every cell is."""
        fams = {c.declared_family for c in self.cells}
        return "affine" if fams == {"affine"} else "state-dependent"

    def layer_slice(self, layer: int = -1) -> slice:
        """Coordinates of layer ``layer`` (negative counts from the end) in the flat state."""
        n = len(self.cells)
        if not -n <= layer < n:
            raise DynlabInputError(f"layer {layer} out of range; allowed: {-n}..{n - 1}")
        layer %= n
        return slice(self._bounds[layer], self._bounds[layer + 1])

    def init_state(self, batch: int, device=None, dtype=None) -> torch.Tensor:
        p = self.readout.weight if isinstance(self.readout, nn.Linear) else self.readout[0].weight
        return torch.zeros(batch, self.state_size, device=device or p.device, dtype=dtype or p.dtype)

    def _split(self, state: torch.Tensor) -> list[torch.Tensor]:
        return [state[..., self._bounds[i] : self._bounds[i + 1]] for i in range(len(self.cells))]

    def step(self, state: torch.Tensor, tokens: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """One step: ``state [B, S]``, ``tokens [B]`` → ``(logits [B, C], state [B, S])``."""
        u = self.embed(tokens)  # [B, D]
        new = []
        for cell, h in zip(self.cells, self._split(state)):
            u, h = cell.step(h, u)
            new.append(h)
        return self.readout(u), torch.cat(new, dim=-1)

    def fused_kind(self) -> str | None:
        """The fused training kernel (a key of :data:`dynlab.tracking.models.cell_base.FUSED_KERNELS`)
        that computes exactly this tracker's loss from a zero initial state, or None.

        It needs the class attribute ``fused_ok`` (not lost by an override), one cell
        whose :meth:`~dynlab.tracking.models.Cell.fused_kind` names a kernel, a plain
        ``nn.Embedding`` (no ``max_norm``, ``padding_idx``, frequency scaling or sparse
        gradient), a linear readout with bias, and no parameters beyond the embedding, the
        cell and the readout.
        """
        if not type(self).fused_ok or len(self.cells) != 1:
            return None
        if type(self.readout) is not nn.Linear or self.readout.bias is None:
            return None
        emb = self.embed
        if type(emb) is not nn.Embedding or emb.max_norm is not None or emb.padding_idx is not None:
            return None
        if emb.scale_grad_by_freq or emb.sparse:
            return None
        outside = {name for name, _ in self.named_parameters() if not name.startswith("cells.0.")}
        if outside != {"embed.weight", "readout.weight", "readout.bias"}:
            return None
        return self.cells[0].fused_kind()

    def final_linear(self) -> nn.Linear:
        """The last linear layer of the readout: the decoder whose boundaries the
        analyses measure (the readout itself when it is linear)."""
        return self.readout if isinstance(self.readout, nn.Linear) else self.readout[-1]

    def readout_features(self, u: torch.Tensor) -> torch.Tensor:
        """The input of :meth:`final_linear` from the last cell's output ``u [..., O]``:
        ``u`` itself for a linear readout, the hidden layer of an MLP readout."""
        return u if isinstance(self.readout, nn.Linear) else self.readout[:-1](u)

    def forward(
        self,
        tokens: torch.Tensor,
        state: torch.Tensor | None = None,
        return_states: bool = False,
        return_features: bool = False,
    ) -> TrackerOutput:
        """Run ``tokens [B, T]`` from ``state [B, S]`` (zero if None).

        ``return_states``: also the states of every layer ``[B, T, S]``;
        ``return_features``: also the readout's features ``[B, T, F]``
        (:meth:`readout_features`), what the final linear layer reads (for the Mamba-style
        cells the output C_t·h_t (+ D x̃_t), not the state).
        """
        if state is None:
            state = self.init_state(tokens.shape[0])
        u = self.embed(tokens)  # [B, T, D]
        finals, all_states = [], []
        for cell, h0 in zip(self.cells, self._split(state)):
            u, hs = cell(u, h0)  # u [B, T, O], hs [B, T, S_l]
            finals.append(hs[:, -1])
            if return_states:
                all_states.append(hs)
        states = torch.cat(all_states, dim=-1) if return_states else None
        if return_features:
            feats = self.readout_features(u)  # [B, T, F]
            return TrackerOutput(self.final_linear()(feats), torch.cat(finals, dim=-1), states, feats)
        return TrackerOutput(self.readout(u), torch.cat(finals, dim=-1), states)


def declared_fused_kind(arch: str, *, layers: int = 1, nonlinearity: str | None = None,
                        readout: str = "linear") -> str | None:
    """The fused training kernel of a :class:`Tracker` built with these arguments, read
    from the declarations alone (nothing is built): a key of
    :data:`dynlab.tracking.models.cell_base.FUSED_KERNELS`, or None.

    The conditions are those of :meth:`Tracker.fused_kind` that the arguments decide: one
    layer, a linear readout (with bias), ``Tracker.fused_ok``, the cell class's declared
    ``fused``, and a phi (``nonlinearity``, else the class's ``default_phi``) in
    :data:`~dynlab.tracking.models.cell_base.FUSED_KERNEL_PHIS` of that kernel.  The instance checks of
    :meth:`Cell.fused_kind` (exactly the kernel's parameters, plain ``nn.Linear`` layers)
    are what a class declaring ``fused`` promises; on the built-in cells both agree
    (tests/test_fused_eligibility.py).
    """
    if not Tracker.fused_ok or layers != 1 or readout != "linear":
        return None
    cell_cls = get_cell(arch)
    kind = cell_cls.fused
    if kind is None or (nonlinearity or cell_cls.default_phi) not in FUSED_KERNEL_PHIS[kind]:
        return None
    return kind
