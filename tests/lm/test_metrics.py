"""LM metrics: PPL(t) aggregation, Definition 3.2, EffRem distances, state statistics."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from scipy.spatial.distance import cosine, jensenshannon

from dynlab.lm.analysis.metrics import (
    binned_ppl, distribution_distance, effective_remembrance, length_generalization, position_ppl, state_statistics,
)
from dynlab.lm.evaluate import truncated_context_probs
from dynlab.lm.models.model import RecurrentLM


def test_ppl_averages_nll_before_exponentiating():
    nll = np.array([[0.0, 1.0], [2.0, 1.0]])
    ppl = position_ppl(nll)
    assert ppl.sel(t=1).item() == pytest.approx(math.e)  # exp(mean(0, 2))
    assert ppl.sel(t=1).item() != pytest.approx((1 + math.e**2) / 2)  # mean of per-sample PPLs would be 4.19
    assert ppl.sel(t=2).item() == pytest.approx(math.e)
    assert ppl.attrs["long_name"] and ppl.attrs["units"] == "1"


def test_binned_ppl_pools_samples_and_positions():
    nll = np.array([[0.0, 2.0, 1.0, 1.0, 9.0], [4.0, 2.0, 3.0, 1.0, 9.0]])
    b = binned_ppl(nll, 2)
    assert b.dims == ("t_bin",) and b["t_bin"].values.tolist() == [2, 4]
    assert b.values.tolist() == pytest.approx([math.exp(2.0), math.exp(1.5)])


def _curve(values, t):
    import xarray as xr
    return xr.DataArray(np.asarray(values, dtype=float), dims=("t",), coords={"t": t})


def test_definition_3_2_failure_reports_worst_violation():
    verdict = length_generalization(_curve([5.0, 4.0, 4.5, 3.9, 4.2], [8, 16, 24, 32, 40]), train_length=16)
    assert not verdict.passed
    assert (verdict.p_star, verdict.t_star) == (4.0, 16)
    assert verdict.worst_violation == pytest.approx(0.5) and verdict.worst_t == 24


def test_definition_3_2_pass_ignores_positions_before_t_star():
    verdict = length_generalization(_curve([9.0, 4.0, 3.9, 4.0, 3.0], [8, 16, 24, 32, 40]), train_length=16)
    assert verdict.passed and verdict.worst_violation == 0.0 and verdict.t_star == 16


def test_definition_3_2_needs_positions_beyond_training():
    with pytest.raises(ValueError, match="train_length"):
        length_generalization(_curve([1.0, 2.0], [1, 2]), train_length=4)


def _random_probs(shape, seed):
    rng = np.random.default_rng(seed)
    p = rng.random(shape) ** 3
    return p / p.sum(axis=-1, keepdims=True)


def test_total_variation_against_brute_force():
    p, q = _random_probs((3, 7), 0), _random_probs((3, 7), 1)
    brute = [0.5 * sum(abs(p[i, v] - q[i, v]) for v in range(7)) for i in range(3)]
    assert distribution_distance(p, q, "tv").tolist() == pytest.approx(brute, rel=1e-12, abs=1e-12)


def test_js_and_cos_against_scipy():
    p, q = _random_probs((4, 9), 2), _random_probs((4, 9), 3)
    js = [jensenshannon(p[i], q[i], base=2) ** 2 for i in range(4)]
    cos = [cosine(p[i], q[i]) for i in range(4)]
    assert distribution_distance(p, q, "js").tolist() == pytest.approx(js, rel=1e-9, abs=1e-12)
    assert distribution_distance(p, q, "cos").tolist() == pytest.approx(cos, rel=1e-9, abs=1e-12)


def test_js_handles_zero_probabilities():
    p, q = np.array([1.0, 0.0]), np.array([0.0, 1.0])
    assert distribution_distance(p, q, "js") == pytest.approx(1.0)


@pytest.mark.parametrize("kind", ["tv", "js", "cos"])
def test_effrem_zero_at_t0_exactly_and_matches_unchunked_forward(kind):
    model = RecurrentLM("mamba2", d_model=16, n_layers=1, n_heads=2, head_dim=4, d_state=4,
                        generator=torch.Generator().manual_seed(0))
    tokens = torch.randint(0, 256, (3, 40), generator=torch.Generator().manual_seed(1))
    starts = np.array([0, 7, 25])
    probs = truncated_context_probs(model, tokens, starts, chunk_len=16)
    full = probs[:, 0]
    eff = effective_remembrance(full, probs, starts, kind)
    assert eff.sel(t=0).item() == 0.0
    with torch.no_grad():
        trunc = torch.softmax(model(tokens[:, 25:])[0][:, -1].double(), -1).numpy()
        whole = torch.softmax(model(tokens)[0][:, -1].double(), -1).numpy()
    expected = distribution_distance(whole, trunc, kind).mean()
    assert eff.sel(t=25).item() == pytest.approx(expected, rel=1e-5, abs=1e-9)
    assert eff.sel(t=25).item() > 0
    assert eff.attrs["units"] and eff.attrs["long_name"]


def test_bad_distance_raises():
    with pytest.raises(ValueError, match="distance must be one of"):
        distribution_distance(np.ones(2) / 2, np.ones(2) / 2, "kl")


def test_state_statistics_against_hand_values():
    states = np.zeros((2, 1, 2, 1, 2))  # [S, layer, head, pos, entries]
    states[0, 0, 0, 0] = [3.0, 4.0]
    states[1, 0, 0, 0] = [0.0, 0.0]
    states[:, 0, 1, 0] = [[1.0, 1.0], [1.0, 1.0]]
    ds = state_statistics(states, np.array([64]))
    assert ds.state_mean.sel(head=0).item() == pytest.approx(7 / 4)
    assert ds.state_std.sel(head=0).item() == pytest.approx(np.std([3, 4, 0, 0]))
    assert ds.state_norm.sel(head=0).item() == pytest.approx(2.5)  # mean of norms 5 and 0
    assert ds.state_std.sel(head=1).item() == 0.0 and ds.state_norm.sel(head=1).item() == pytest.approx(math.sqrt(2))
    assert all(ds[v].attrs["units"] for v in ds.data_vars)
