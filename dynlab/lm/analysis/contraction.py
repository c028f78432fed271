"""How fast an LM's recurrent state forgets: the decay rates of its state map on real text.

Paper A's language for forgetting is contraction of the state map. For the diagonal SSM
mixers dynlab trains, the own-state step of a layer is diagonal: at token t it multiplies
each state entry by its decay

- Mamba-2: ``a_t = exp(Δ_t,h · A_h)`` for every entry of head h (Δ = softplus(dt + dt_bias));
- Mamba-1: ``a_t = exp(Δ_t,d · A_d,n)`` per channel d and state entry n;
- GLA: ``a_t = exp(g_t,h,k)`` per head and key (the log forget gate).

A layer's state also reads the layers below it at the same token, so the step Jacobian of
the whole state is block lower-triangular over layers with these diagonal blocks (and the
convolution windows' shifts, whose eigenvalues are 0): its eigenvalues are the decays, and
the Lyapunov exponents of a product of such maps are those of the diagonal blocks. Over a
text, entry i of the state forgets at the rate

    λ_i = mean over tokens of log a_t,i     (per token, ≤ 0)

(:func:`decay_rates`). The state's slowest rate ``λ_max = max_i λ_i`` is the top Lyapunov
exponent of the state map, and ``τ = −1 / λ_max`` its memory horizon in tokens: the
e-folding length of the entry that forgets slowest (:func:`forgetting`). A model whose
horizon exceeds its training length holds state it never learned to clear.

The decays are read from the model's own layers (a forward hook on each mixer's input),
so they are the ones the trained weights apply; ``tests/lm/test_contraction.py`` checks
them against the dense own-state Jacobian of :mod:`dynlab.lm.analysis.recurrence`.
"""

from __future__ import annotations

import numpy as np
import torch
import torch.nn.functional as F
import xarray as xr
from torch import nn

from dynlab.errors import DynlabInputError
from dynlab.lm.models.mixers import GLAMixer, Mamba1Mixer, Mamba2Mixer

__all__ = ["decay_rates", "forgetting", "log_decays"]


@torch.no_grad()
def log_decays(mixer: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """log a_t of every state entry of one mixer for its input ``x [B, T, D]`` (the
    normalised block input): ``[B, T, E]`` with E the entries that decay alike (Mamba-2:
    heads; Mamba-1: channels × state entries; GLA: heads × keys)."""
    if isinstance(mixer, Mamba2Mixer):
        h, _, n = mixer.state_shape()
        dt = torch.split(mixer.in_proj(x), [mixer.d_inner, mixer.d_inner + 2 * n, h], dim=-1)[2]
        return F.softplus(dt + mixer.dt_bias) * -torch.exp(mixer.A_log)  # [B, T, H]
    if isinstance(mixer, Mamba1Mixer):
        xs = mixer.in_proj(x).chunk(2, dim=-1)[0]
        xs = mixer._conv(xs, None)[0]  # the first window from zeros, as the model's own forward
        dt_raw = torch.split(mixer.x_proj(xs), [mixer.dt_rank, mixer.d_state, mixer.d_state], dim=-1)[0]
        delta = F.softplus(mixer.dt_proj(dt_raw))  # [B, T, D_inner]
        return (delta[..., None] * -torch.exp(mixer.A_log)).flatten(2)  # [B, T, D_inner · N]
    if isinstance(mixer, GLAMixer):
        h, dk, dv = mixer.state_shape()
        g = torch.split(mixer.qkvg_proj(x), [h * dk, h * dk, h * dk, h * dv, h * dv], dim=-1)[2]
        return F.logsigmoid(g) / mixer.gate_normalizer  # [B, T, H · K]
    raise DynlabInputError(f"decay rates are defined for Mamba-2, Mamba-1 and GLA mixers, not {type(mixer).__name__}")


@torch.no_grad()
def decay_rates(model: nn.Module, tokens: torch.Tensor) -> list[np.ndarray]:
    """Per layer, the mean log decay of every state entry over ``tokens [B, T]`` (from the
    zero state; :func:`log_decays` of each mixer's input): ``[E]`` arrays, per token."""
    inputs: list[torch.Tensor] = []
    hooks = [block.mixer.register_forward_pre_hook(lambda _m, args: inputs.append(args[0].detach()))
             for block in model.blocks]
    try:
        model.eval()
        model(tokens)
    finally:
        for hook in hooks:
            hook.remove()
    return [log_decays(block.mixer, x).double().mean(dim=(0, 1)).cpu().numpy() for block, x in zip(model.blocks, inputs)]


def forgetting(model: nn.Module, tokens: torch.Tensor) -> xr.Dataset:
    """The state's forgetting over ``tokens [B, T]``: ``forget_rate`` (λ_max, the slowest
    entry's mean log decay, per token), ``memory_horizon`` (τ = −1/λ_max, tokens; inf
    for a state that does not decay) and ``layer_forget_rate`` (λ_max of each layer, dim
    ``layer``) — the module docstring defines them."""
    rates = decay_rates(model, tokens)
    per_layer = np.array([float(r.max()) for r in rates])
    top = float(per_layer.max())
    ds = xr.Dataset({
        "forget_rate": ((), top),
        "memory_horizon": ((), -1.0 / top if top < 0 else np.inf),
        "layer_forget_rate": (("layer",), per_layer),
    }, coords={"layer": np.arange(len(rates))})
    ds["forget_rate"].attrs.update(long_name="top Lyapunov exponent of the state map", units="1/token")
    ds["memory_horizon"].attrs.update(long_name="memory horizon -1/forget_rate", units="tokens")
    ds["layer_forget_rate"].attrs.update(long_name="slowest mean log decay of the layer's state", units="1/token")
    return ds


#: Validation windows of each run whose forgetting :func:`runs_forgetting` measures.
FORGETTING_WINDOWS = 8


def runs_forgetting(specs: list, folders: list) -> xr.Dataset:
    """``forget_rate(run)`` and ``memory_horizon(run)`` (:func:`forgetting`) of stored LM runs:
    each run's trained weights (``folders[i]/model.safetensors``; NaN for a run without
    them) on :data:`FORGETTING_WINDOWS` validation windows of its evaluation length, evenly
    spaced over its validation text, from the zero state."""
    from dynlab.lm.hub.checkpoint import load_checkpoint
    from dynlab.lm.data.loaders import take
    from dynlab.lm.run.text import data_corpus

    rate, horizon = [], []
    for spec, folder in zip(specs, folders):
        if not (folder / "model.safetensors").is_file():
            rate.append(np.nan)
            horizon.append(np.nan)
            continue
        model, _ = load_checkpoint(folder)
        val = data_corpus(spec.data).val
        length = min(spec.eval_length, len(val) - 1)
        starts = torch.linspace(0, len(val) - length - 1, FORGETTING_WINDOWS).long()
        ds = forgetting(model, take(val, starts[:, None] + torch.arange(length)))
        rate.append(float(ds["forget_rate"]))
        horizon.append(float(ds["memory_horizon"]))
    return xr.Dataset({"forget_rate": ("run", rate), "memory_horizon": ("run", horizon)})
