"""Interop: a randomly initialised HF ``Mamba2ForCausalLM`` analysed by dynlab's LM metrics.

Skipped when ``transformers`` is absent. PPL(t), EffRem and state statistics are computed
from HF's logits and SSM cache, and checked against direct computations.
"""

from __future__ import annotations

import numpy as np
import pytest
import torch

from dynlab.analysis.lm_metrics import distribution_distance, effective_remembrance, position_ppl, state_statistics

transformers = pytest.importorskip("transformers")


@pytest.fixture(scope="module")
def hf_model():
    config = transformers.Mamba2Config(vocab_size=256, hidden_size=32, num_hidden_layers=2, num_heads=4, head_dim=16,
                                       expand=2, state_size=8, n_groups=1, chunk_size=8, pad_token_id=0,
                                       bos_token_id=0, eos_token_id=0)
    torch.manual_seed(0)  # HF initialises from the global RNG; this test owns its process-wide seed use
    return transformers.Mamba2ForCausalLM(config).eval()


def _tokens(b: int = 3, t: int = 24) -> torch.Tensor:
    return torch.randint(1, 256, (b, t), generator=torch.Generator().manual_seed(1))


def test_ppl_from_hf_logits_matches_direct_computation(hf_model):
    tokens = _tokens()
    with torch.no_grad():
        logits = hf_model(tokens).logits.double()  # [B, T, 256]
    logp = torch.log_softmax(logits[:, :-1], -1)
    nll = -logp.gather(-1, tokens[:, 1:, None])[..., 0].numpy()  # [B, T-1]
    ppl = position_ppl(nll)
    manual = [np.exp(np.mean([nll[s, i] for s in range(3)])) for i in range(nll.shape[1])]
    np.testing.assert_allclose(ppl.values, manual, rtol=1e-12)
    assert 100 < ppl.values.mean() < 1000  # near-uniform predictions of an untrained model over 256 bytes


def test_effrem_of_hf_model(hf_model):
    tokens = _tokens()
    starts = np.array([0, 4, 12, 23])
    with torch.no_grad():
        probs = np.stack([torch.softmax(hf_model(tokens[:, t:]).logits[:, -1].double(), -1).numpy() for t in starts], 1)
    eff = effective_remembrance(probs[:, 0], probs, starts, "tv")
    assert eff.sel(t=0).item() == 0.0
    brute = np.mean([0.5 * np.abs(probs[s, 0] - probs[s, 2]).sum() for s in range(3)])
    assert eff.sel(t=12).item() == pytest.approx(brute, rel=1e-12)
    assert eff.sel(t=23).item() == pytest.approx(distribution_distance(probs[:, 0], probs[:, 3]).mean(), rel=1e-12)


def test_state_statistics_of_hf_ssm_cache(hf_model):
    tokens = _tokens()
    with torch.no_grad():
        out = hf_model(tokens, use_cache=True)
    cache = out.cache if hasattr(out, "cache") else out.past_key_values
    if hasattr(cache, "get_recurrent_state"):
        ssm = [cache.get_recurrent_state(i) for i in range(2)]
    else:
        ssm = getattr(cache, "ssm_states", None)
    if ssm is None or any(s is None for s in ssm):
        pytest.skip("this transformers version exposes no SSM states in its cache")
    states = torch.stack([s.double() for s in ssm], dim=1)  # [B, layer, H, P, N]
    arr = states.flatten(3)[:, :, :, None, :].numpy()  # [B, layer, H, 1, P*N]
    ds = state_statistics(arr, np.array([tokens.shape[1]]))
    assert ds.state_norm.shape == (2, 4, 1)
    expected = states[:, 1, 2].flatten(1).norm(dim=1).mean().item()
    assert ds.state_norm.sel(layer=1, head=2).item() == pytest.approx(expected, rel=1e-12)
    assert ds.state_norm.min() > 0
