"""The recurrent state of an LM as it travels between calls.

A recurrent LM's state after a chunk has two parts per layer:

- the **SSM state** ``[B, H, P, N]`` (the layer's memory; what the initial-state
  interventions draw and the state statistics measure), and
- the **convolution window** ``[B, C, K − 1]``: the last ``K − 1`` inputs of the layer's
  short causal convolution of width ``K`` (``None`` for a layer without one).

:class:`CarriedStates` is a list of the SSM states (so every consumer of per-layer SSM
states works on it unchanged) with the windows in its ``conv`` attribute. A plain list
given as initial states means zero windows: the convolution sees zeros before the first
token, exactly as at the start of a document.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["CarriedStates", "conv_windows", "detach_states", "map_states", "states_to"]


class CarriedStates(list):
    """Per-layer SSM states ``[B, H, P, N]`` plus ``conv``: per-layer convolution windows (or None)."""

    def __init__(self, ssm: Sequence[torch.Tensor], conv: Sequence[torch.Tensor | None]) -> None:
        super().__init__(ssm)
        if len(conv) != len(self):
            raise ValueError(f"need one convolution window per layer: {len(self)} SSM states, {len(conv)} windows")
        self.conv = list(conv)


def conv_windows(states: Sequence[torch.Tensor] | None, n_layers: int) -> list[torch.Tensor | None]:
    """The windows carried by ``states`` (None per layer for a plain list or None: zero windows)."""
    if isinstance(states, CarriedStates):
        return list(states.conv)
    return [None] * n_layers


def map_states(states: Sequence[torch.Tensor], fn) -> list[torch.Tensor] | CarriedStates:
    """``fn`` applied to every SSM state and every window of ``states``; the type is kept."""
    ssm = [fn(s) for s in states]
    if isinstance(states, CarriedStates):
        return CarriedStates(ssm, [None if w is None else fn(w) for w in states.conv])
    return ssm


def states_to(states: Sequence[torch.Tensor], device: torch.device | str) -> list[torch.Tensor] | CarriedStates:
    """``states`` (SSM states and any windows) moved to ``device``; the type is kept."""
    return map_states(states, lambda s: s.to(device))


def detach_states(states: Sequence[torch.Tensor]) -> list[torch.Tensor] | CarriedStates:
    """``states`` (SSM states and any windows) detached; the type is kept."""
    return map_states(states, lambda s: s.detach())
