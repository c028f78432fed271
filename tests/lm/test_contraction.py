"""The state's decay rates (dynlab.lm.analysis.contraction) against the eigenvalues of the dense step
Jacobian of the whole state (dynlab.lm.analysis.recurrence), and an analytic case."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from dynlab.lm.analysis.contraction import decay_rates, forgetting, log_decays
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.analysis.recurrence import LMRecurrence, flat_states, state_jacobians

KW = {
    "mamba2": {"n_heads": 2, "head_dim": 4, "d_state": 4, "chunk_size": 8},
    "mamba1": {"d_inner": 8, "d_state": 4, "n_heads": 2, "chunk_size": 8},
    "gla": {"n_heads": 2, "key_dim": 4, "value_dim": 4, "chunk_size": 8},
}


def _model(mixer: str) -> RecurrentLM:
    return RecurrentLM(mixer, d_model=8, n_layers=2, mlp_ratio=0, generator=torch.Generator().manual_seed(3),
                       **KW[mixer]).double()


def _repeat(mixer: str, model: RecurrentLM) -> int:
    """State entries that share one decay: Mamba-2 a head's P × N, GLA a key's V values, Mamba-1 one."""
    h, p, n = model.state_shapes()[0]
    return {"mamba2": p * n, "gla": n, "mamba1": 1}[mixer]


@pytest.mark.parametrize("mixer", sorted(KW))
def test_the_decays_are_the_eigenvalues_of_the_step_jacobian(mixer):
    model = _model(mixer)
    rec = LMRecurrence(model)
    tokens = torch.randint(0, 256, (1, 7), generator=torch.Generator().manual_seed(4))
    inputs = []
    hooks = [b.mixer.register_forward_pre_hook(lambda _m, a: inputs.append(a[0])) for b in model.blocks]
    with torch.no_grad():
        model(tokens)
    for hk in hooks:
        hk.remove()
    t = tokens.shape[1] - 1
    decays = np.concatenate([np.repeat(np.exp(log_decays(b.mixer, x)[0, t].numpy()), _repeat(mixer, model))
                             for b, x in zip(model.blocks, inputs)])
    h, x = flat_states(rec, tokens)
    eig = np.sort(np.abs(np.linalg.eigvals(state_jacobians(rec, h.detach(), x)[0])))[::-1]
    assert np.all(eig[len(decays):] < 1e-8)  # the rest: the convolution windows' shifts
    np.testing.assert_allclose(eig[:len(decays)], np.sort(decays)[::-1], rtol=1e-7, atol=1e-10)


def test_a_constant_step_size_forgets_at_its_analytic_rate():
    """Δ = c at every token and A = −1 in every head: λ = −c and τ = 1/c."""
    model = _model("mamba2")
    c = 0.05
    with torch.no_grad():
        for block in model.blocks:
            m = block.mixer
            h = m.n_heads
            m.in_proj.weight[-h:] = 0.0  # the dt rows: Δ no longer depends on the input
            m.dt_bias.fill_(math.log(math.expm1(c)))  # softplus(dt_bias) = c
            m.A_log.zero_()
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(5))
    rates = decay_rates(model, tokens)
    assert all(np.allclose(r, -c, rtol=1e-12) for r in rates)
    ds = forgetting(model, tokens)
    assert float(ds["forget_rate"]) == pytest.approx(-c, rel=1e-12)
    assert float(ds["memory_horizon"]) == pytest.approx(1 / c, rel=1e-12)
    assert ds["layer_forget_rate"].sizes == {"layer": 2} and ds["memory_horizon"].attrs["units"] == "tokens"
