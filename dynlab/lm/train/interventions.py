"""Initial-state interventions used during training only (docs/length-generalization.md).

Each intervention answers two calls per training step:
``initial_states(batch_size, shapes, fresh, generator)`` gives one ``[B, H, P, N]`` initial
state per layer (shapes are ``(H, P, N)`` per layer; ``fresh [B]`` marks slots that start a
new document), and ``observe(final_states)`` sees the detached final states of the step.
Validation never calls them: it always starts from the zero state.

- ``zero``: all zeros (baseline).
- ``random-noise``: every entry i.i.d. N(0, σ²).
- ``fitted-noise``: per layer l and head h, running statistics of the final states over the
  batch, the head's channel and state dims: μ ← (1−β)·Mean(h_T) + β·μ,
  σ² ← (1−β)·Var(h_T) + β·σ² with β = 0.1 (the new statistic has weight 0.9; Var is the
  population variance). The first observation initialises μ, σ² directly; before it the
  initial state is zero. Samples are i.i.d. N(μ_lh, σ²_lh).
- ``state-passing``: the previous step's detached final state (random windows, so an
  unrelated text), each (layer, head, batch slot) reset to zero independently with
  probability ``reset_prob`` = 0.1; zero before the first step.
- ``tbtt``: with :class:`~dynlab.lm.data.loaders.SequentialChunkLoader`, the previous chunk's
  detached final state of the same slot; zero where the slot is ``fresh``.

The convolution window (the last ``K − 1`` inputs of each layer's short convolution, see
:mod:`dynlab.lm.models.states`) is part of the state that travels: state passing and TBTT pass
the previous final window together with the SSM state (state passing resets a layer's
window of a slot to zero with probability ``reset_prob``, independently of the heads;
TBTT resets it where the slot is ``fresh``). The noise interventions draw the SSM state
only and start every window at zero, as at the start of a document: the window holds
the last few inputs, not a memory of the past, and noise in it would be noise on the
first tokens' features rather than on the state.

The noise is drawn by the generator on its own device and the observed states are kept
where they are (detached): with a generator on the model's device a training step on a
GPU never copies a state to the host, and with a CPU generator (the stacks') the draws are
the CPU's, the masks and statistics moved to where they are used.
"""

from __future__ import annotations

import torch

from dynlab.errors import DynlabInputError
from dynlab.lm.models.states import CarriedStates, conv_windows, map_states

__all__ = [
    "Intervention", "ZeroInit", "RandomNoise", "FittedNoise", "StatePassing", "TBTT",
    "INTERVENTIONS", "make_intervention",
]

States = list[torch.Tensor]
Shapes = list[tuple[int, int, int]]


class Intervention:
    """Base: zero initial states; ``loader`` names the batch loader the intervention needs."""

    name = "zero"
    loader = "random"

    def initial_states(self, batch_size: int, shapes: Shapes, fresh: torch.Tensor,
                       generator: torch.Generator) -> States:
        """One ``[B, H, P, N]`` float32 initial state per layer, on the generator's device."""
        return [torch.zeros(batch_size, *s, device=generator.device) for s in shapes]

    def observe(self, final_states: States) -> None:
        """See the detached final states of a training step (default: ignore)."""


class ZeroInit(Intervention):
    """Baseline: every training sequence starts from the zero state."""


class RandomNoise(Intervention):
    """Initial states with i.i.d. N(0, σ²) entries."""

    name = "random-noise"

    def __init__(self, sigma: float = 0.1) -> None:
        if sigma < 0:
            raise ValueError(f"sigma must be >= 0, got {sigma}")
        self.sigma = sigma

    def initial_states(self, batch_size: int, shapes: Shapes, fresh: torch.Tensor,
                       generator: torch.Generator) -> States:
        return [self.sigma * torch.randn(batch_size, *s, generator=generator, device=generator.device) for s in shapes]


class FittedNoise(Intervention):
    """Gaussian initial states with per-layer, per-head mean and variance fitted to final states."""

    name = "fitted-noise"

    def __init__(self, beta: float = 0.1) -> None:
        if not 0.0 <= beta < 1.0:
            raise ValueError(f"beta must be in [0, 1), got {beta}")
        self.beta = beta
        self.mean: list[torch.Tensor] | None = None  # per layer [H], float64
        self.var: list[torch.Tensor] | None = None  # per layer [H], float64

    def observe(self, final_states: States) -> None:
        flat = [s.detach().double().transpose(0, 1).flatten(1) for s in final_states]  # per layer [H, B*P*N]
        means = [f.mean(dim=1) for f in flat]
        vars_ = [f.var(dim=1, unbiased=False) for f in flat]
        if self.mean is None or self.var is None:
            self.mean, self.var = means, vars_
            return
        b = self.beta
        self.mean = [(1 - b) * m_new + b * m for m_new, m in zip(means, self.mean)]
        self.var = [(1 - b) * v_new + b * v for v_new, v in zip(vars_, self.var)]

    def initial_states(self, batch_size: int, shapes: Shapes, fresh: torch.Tensor,
                       generator: torch.Generator) -> States:
        if self.mean is None or self.var is None:
            return super().initial_states(batch_size, shapes, fresh, generator)
        out = []
        for s, m, v in zip(shapes, self.mean, self.var):
            noise = torch.randn(batch_size, *s, generator=generator, dtype=torch.float64, device=generator.device)
            m, v = m.to(noise.device), v.to(noise.device)  # statistics of states observed on another device
            out.append((m[:, None, None] + v.sqrt()[:, None, None] * noise).float())  # [B, H, P, N]
        return out


class StatePassing(Intervention):
    """Previous step's final states, reset to zero per (layer, head, slot) with probability ``reset_prob``."""

    name = "state-passing"

    def __init__(self, reset_prob: float = 0.1) -> None:
        if not 0.0 <= reset_prob <= 1.0:
            raise ValueError(f"reset_prob must be in [0, 1], got {reset_prob}")
        self.reset_prob = reset_prob
        self.previous: States | None = None

    def observe(self, final_states: States) -> None:
        self.previous = _detached(final_states)

    def initial_states(self, batch_size: int, shapes: Shapes, fresh: torch.Tensor,
                       generator: torch.Generator) -> States:
        if self.previous is None or self.previous[0].shape[0] != batch_size:
            return super().initial_states(batch_size, shapes, fresh, generator)
        out, windows = [], []
        for prev, window in zip(self.previous, conv_windows(self.previous, len(self.previous))):
            keep = (torch.rand(prev.shape[:2], generator=generator, device=generator.device)
                    >= self.reset_prob).to(prev.device)  # [B, H]
            out.append(prev * keep[:, :, None, None])
            if window is not None:
                keep_w = (torch.rand(window.shape[0], generator=generator, device=generator.device)
                          >= self.reset_prob).to(window.device)
                window = window * keep_w[:, None, None]
            windows.append(window)
        return CarriedStates(out, windows)


class TBTT(Intervention):
    """Truncated backpropagation through time: carry each slot's final state to its next chunk."""

    name = "tbtt"
    loader = "sequential"

    def __init__(self) -> None:
        self.previous: States | None = None

    def observe(self, final_states: States) -> None:
        self.previous = _detached(final_states)

    def initial_states(self, batch_size: int, shapes: Shapes, fresh: torch.Tensor,
                       generator: torch.Generator) -> States:
        if self.previous is None:
            return super().initial_states(batch_size, shapes, fresh, generator)
        keep = ~fresh.to(self.previous[0].device)  # [B]
        windows = [None if w is None else w * keep[:, None, None] for w in conv_windows(self.previous, len(self.previous))]
        return CarriedStates([prev * keep[:, None, None, None] for prev in self.previous], windows)


def _detached(states: States) -> States:
    """The SSM states and any convolution windows, detached, in float32, where they are."""
    return map_states(states, lambda s: s.detach().float())


INTERVENTIONS: dict[str, type[Intervention]] = {
    "zero": ZeroInit, "random-noise": RandomNoise, "fitted-noise": FittedNoise,
    "state-passing": StatePassing, "tbtt": TBTT,
}


def make_intervention(name: str, sigma: float = 0.1, beta: float = 0.1, reset_prob: float = 0.1) -> Intervention:
    """Build an intervention by name (knobs not used by that intervention are ignored)."""
    if name not in INTERVENTIONS:
        raise DynlabInputError(f"intervention must be one of {sorted(INTERVENTIONS)}, got {name!r}")
    if name == "random-noise":
        return RandomNoise(sigma)
    if name == "fitted-noise":
        return FittedNoise(beta)
    if name == "state-passing":
        return StatePassing(reset_prob)
    return INTERVENTIONS[name]()
