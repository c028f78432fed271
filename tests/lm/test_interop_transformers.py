"""Interop: a randomly initialised HF ``Mamba2ForCausalLM`` analysed by dynlab's LM metrics.

Skipped when ``transformers`` is absent. PPL(t), EffRem and state statistics are computed
from HF's logits and SSM cache, and checked against direct computations.
"""

from __future__ import annotations

import numpy as np
import pytest
from helpers.optional import need_transformers
import torch

from dynlab.lm.analysis.metrics import distribution_distance, effective_remembrance, position_ppl, state_statistics

transformers = need_transformers()


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
    np.testing.assert_allclose(ppl.values, manual, rtol=1e-12, atol=0)
    assert 100 < ppl.values.mean() < 1000  # near-uniform predictions of an untrained model over 256 bytes


def test_effrem_of_hf_model(hf_model):
    tokens = _tokens()
    starts = np.array([0, 4, 12, 23])
    with torch.no_grad():
        probs = np.stack([torch.softmax(hf_model(tokens[:, t:]).logits[:, -1].double(), -1).numpy() for t in starts], 1)
    eff = effective_remembrance(probs[:, 0], probs, starts, "tv")
    assert eff.sel(t=0).item() == 0.0
    brute = np.mean([0.5 * np.abs(probs[s, 0] - probs[s, 2]).sum() for s in range(3)])
    assert eff.sel(t=12).item() == pytest.approx(brute, rel=1e-12, abs=1e-12)
    assert eff.sel(t=23).item() == pytest.approx(distribution_distance(probs[:, 0], probs[:, 3]).mean(), rel=1e-12, abs=1e-12)


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
    assert ds.state_norm.sel(layer=1, head=2).item() == pytest.approx(expected, rel=1e-12, abs=1e-12)
    assert ds.state_norm.min() > 0


# -- initial states through the HF models, split-and-carry, post-training ------------------------------------------

from dynlab.lm.hub.hf import CarriedStates, HFRecurrentLM  # noqa: E402


def _mamba1():
    config = transformers.MambaConfig(vocab_size=256, hidden_size=32, num_hidden_layers=2, state_size=8, expand=2,
                                      pad_token_id=0, bos_token_id=0, eos_token_id=0)
    torch.manual_seed(1)  # HF initialises from the global RNG
    return transformers.MambaForCausalLM(config).eval()


@pytest.fixture(scope="module")
def hf_mamba1():
    return _mamba1()


def test_mamba2_split_and_carry_through_the_hf_cache_equals_whole(hf_model):
    tokens = _tokens(3, 29)
    wrapped = HFRecurrentLM(hf_model)
    with torch.no_grad():
        reference = hf_model(tokens).logits  # HF's own forward, zero state
        whole, finals = wrapped(tokens)
        first, carried = wrapped(tokens[:, :11])
        second, finals2 = wrapped(tokens[:, 11:], carried)
    torch.testing.assert_close(whole, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, rtol=1e-5, atol=1e-5)
    for a, b in zip(finals, finals2):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)
    assert isinstance(carried, CarriedStates) and carried[0].shape == (3, 4, 16, 8)


def test_mamba2_past_key_values_keyword_is_silently_dropped(hf_model):
    """The trap dynlab avoids: ``past_key_values=`` restarts the state at zero; ``cache=`` carries it."""
    tokens = _tokens(2, 20)
    with torch.no_grad():
        out = hf_model(tokens[:, :10], use_cache=True)
        dropped = hf_model(tokens[:, 10:], past_key_values=out.cache).logits
        fresh = hf_model(tokens[:, 10:]).logits
        whole = hf_model(tokens).logits[:, 10:]
    torch.testing.assert_close(dropped, fresh, rtol=0, atol=0)
    assert (dropped - whole).abs().max() > 1e-3


def test_mamba1_wrapper_equals_hf_and_carries_state(hf_mamba1):
    tokens = _tokens(2, 23)
    wrapped = HFRecurrentLM(hf_mamba1)
    with torch.no_grad():
        reference = hf_mamba1(tokens).logits
        whole, _ = wrapped(tokens)
        first, carried = wrapped(tokens[:, :9])
        second, _ = wrapped(tokens[:, 9:], carried)
    torch.testing.assert_close(whole, reference, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(torch.cat([first, second], 1), whole, rtol=1e-5, atol=1e-5)


def test_mamba1_hf_prefill_ignores_a_carried_state_but_decoding_uses_it(hf_mamba1):
    """Why dynlab runs Mamba-1's scan itself: HF's multi-token prefill restarts the SSM state at zero."""
    tokens = _tokens(2, 16)
    with torch.no_grad():
        whole = hf_mamba1(tokens).logits
        out = hf_mamba1(tokens[:, :8], use_cache=True)
        prefill = hf_mamba1(tokens[:, 8:], cache=out.cache, use_cache=True).logits
        out = hf_mamba1(tokens[:, :8], use_cache=True)
        steps = [hf_mamba1(tokens[:, i:i + 1], cache=out.cache, use_cache=True).logits for i in range(8, 16)]
    assert (prefill - whole[:, 8:]).abs().max() > 1e-3  # the carried SSM state was ignored
    torch.testing.assert_close(torch.cat(steps, 1), whole[:, 8:], rtol=1e-4, atol=1e-5)  # one token at a time: used


def test_initial_state_changes_the_output_of_both_models(hf_model, hf_mamba1):
    for model in (hf_model, hf_mamba1):
        wrapped = HFRecurrentLM(model)
        tokens = _tokens(2, 12)
        init = [torch.randn(2, *s, generator=torch.Generator().manual_seed(5)) for s in wrapped.state_shapes()]
        with torch.no_grad():
            zero, _ = wrapped(tokens)
            zero2, _ = wrapped(tokens, [torch.zeros_like(s) for s in init])
            noisy, _ = wrapped(tokens, init)
        torch.testing.assert_close(zero, zero2, rtol=0, atol=0)
        assert (noisy - zero).abs().max() > 1e-4


@pytest.mark.slow
@pytest.mark.parametrize("maker", ["mamba2", "mamba1"])
def test_post_training_hf_checkpoint_zero_steps_equals_checkpoint_and_steps_change_it(maker, hf_model, hf_mamba1, tmp_path):
    from dynlab.lm.evaluate import stream_eval, validation_windows
    from dynlab.lm.train.posttrain import PostTrainSpec, PostTrainTrainSpec, checkpoint_digest, load_checkpoint, post_train
    from dynlab.lm.run.text import corpus_for
    from dynlab.lm.spec import InterventionSpec, LMEvalSpec

    model = hf_model if maker == "mamba2" else hf_mamba1
    model.save_pretrained(str(tmp_path / "ckpt"))
    ckpt = tmp_path / "ckpt"
    evals = LMEvalSpec(length_multiple=4, n_samples=3, chunk_len=8, bin_width=8, effrem_points=3, effrem_samples=2,
                       state_points=6)
    spec = PostTrainSpec(checkpoint=str(ckpt), checkpoint_sha256=checkpoint_digest(ckpt), eval=evals,
                         intervention=InterventionSpec(kind="state-passing"),
                         train=PostTrainTrainSpec(steps=0, batch_size=2, seq_len=16))
    result, post = post_train(spec, "cpu")
    # independent: HF's own forward on the same validation windows gives the same PPL(t)
    windows = validation_windows(corpus_for("shakespeare", 0.1).val, 3, 64)
    with torch.no_grad():
        logits = model(windows[:, :-1]).logits.double()
    nll = torch.nn.functional.cross_entropy(logits.transpose(1, 2), windows[:, 1:], reduction="none")
    np.testing.assert_allclose(result["ppl"], torch.exp(nll.mean(0)).numpy(), rtol=1e-4, atol=0)
    for k, v in model.state_dict().items():
        assert torch.equal(post.hf.state_dict()[k], v), k
    assert result["state_t"][0] == 1  # state statistics from t = 1
    stepped = spec.model_copy(update={"train": PostTrainTrainSpec(steps=2, batch_size=2, seq_len=16, lr=1e-2)})
    fresh, _ = load_checkpoint(ckpt)
    result2, post2 = post_train(stepped, "cpu", model=fresh)
    assert result2["train_steps"] == 2 and np.isfinite(result2["ppl"]).all()
    changed = [k for k, v in model.state_dict().items() if not torch.equal(post2.hf.state_dict()[k], v)]
    assert changed
    assert stream_eval(post2, windows[:, :17], chunk_len=8).nll.shape == (3, 16)
