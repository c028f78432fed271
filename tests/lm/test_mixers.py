"""LM mixers and stack: split-and-carry, the dispatched scan vs the reference, gradients to the initial state."""

from __future__ import annotations

import pytest
import torch

from dynlab.errors import DynlabInputError
from dynlab.lm.models.mixers import MIXERS
from dynlab.lm.models.model import RecurrentLM

SMALL = {
    "mamba2": dict(n_heads=2, head_dim=4, d_state=3, chunk_size=5),
    "mamba1": dict(d_inner=8, d_state=3, n_heads=2, chunk_size=5),
    "gla": dict(n_heads=2, key_dim=4, value_dim=3, chunk_size=5),
}


def _model(name: str, impl: str = "dispatch", seed: int = 0) -> RecurrentLM:
    return RecurrentLM(name, d_model=16, n_layers=2, mlp_ratio=2, generator=torch.Generator().manual_seed(seed),
                       impl=impl, **SMALL[name]).double()


def _random_states(model: RecurrentLM, b: int, seed: int = 3) -> list[torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return [torch.randn(b, *s, generator=g, dtype=torch.float64) for s in model.state_shapes()]


def _tokens(b: int = 2, t: int = 23, seed: int = 1) -> torch.Tensor:
    return torch.randint(0, 256, (b, t), generator=torch.Generator().manual_seed(seed))


@pytest.mark.parametrize("name", sorted(MIXERS))
@pytest.mark.parametrize("k", [1, 9, 22], ids=lambda k: f"split{k}")
def test_model_split_and_carry(name, k):
    model, x = _model(name), _tokens()
    h0 = _random_states(model, 2)
    logits, finals = model(x, h0)
    l1, s1 = model(x[:, :k], h0)
    l2, s2 = model(x[:, k:], s1)
    torch.testing.assert_close(torch.cat([l1, l2], dim=1), logits, rtol=1e-10, atol=1e-10)
    for a, b in zip(s2, finals):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_dispatch_mixer_matches_ref_mixer(name):
    fast, reference = _model(name, "dispatch"), _model(name, "ref")
    x = _tokens()
    h0 = _random_states(fast, 2)
    lc, sc = fast(x, h0)
    lr, sr = reference(x, h0)
    torch.testing.assert_close(lc, lr, rtol=1e-9, atol=1e-9)
    for a, b in zip(sc, sr):
        torch.testing.assert_close(a, b, rtol=1e-9, atol=1e-9)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_initial_state_changes_output_and_receives_gradient(name):
    model, x = _model(name), _tokens()
    h0 = [s.requires_grad_() for s in _random_states(model, 2)]
    logits, _ = model(x, h0)
    zero_logits, _ = model(x, None)
    assert (logits - zero_logits).abs().max() > 1e-6
    grads = torch.autograd.grad(logits.square().sum(), h0)
    assert all(g.abs().sum() > 0 for g in grads)


@pytest.mark.parametrize("name", sorted(MIXERS))
def test_none_state_equals_explicit_zero_state(name):
    model, x = _model(name), _tokens()
    a, _ = model(x, None)
    b, _ = model(x, model.zero_states(2, dtype=torch.float64))
    torch.testing.assert_close(a, b, rtol=0, atol=0)


@pytest.mark.parametrize("impl", ["dispatch", "ref"])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_states_of_another_dtype_are_taken_in_the_models(name, impl):
    """A float32 model given float64 states computes in float32, as its stack and its
    convolution windows do: the same logits and states as from the states cast first."""
    model, x = _model(name, impl).float(), _tokens()
    h0 = _random_states(model, 2)
    logits, finals = model(x, h0)
    want_logits, want_finals = model(x, [s.float() for s in h0])
    assert logits.dtype == torch.float32 and all(f.dtype == torch.float32 for f in finals)
    torch.testing.assert_close(logits, want_logits, rtol=0, atol=0)
    for a, b in zip(finals, want_finals):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_parameters_come_only_from_the_generator():
    torch.manual_seed(123)
    a = RecurrentLM("mamba2", d_model=16, n_layers=1, generator=torch.Generator().manual_seed(5), **SMALL["mamba2"])
    torch.manual_seed(456)
    b = RecurrentLM("mamba2", d_model=16, n_layers=1, generator=torch.Generator().manual_seed(5), **SMALL["mamba2"])
    c = RecurrentLM("mamba2", d_model=16, n_layers=1, generator=torch.Generator().manual_seed(6), **SMALL["mamba2"])
    for (name, pa), pb, pc in zip(a.named_parameters(), b.parameters(), c.parameters()):
        torch.testing.assert_close(pa, pb, rtol=0, atol=0, msg=name)
    assert any(not torch.equal(pa, pc) for pa, pc in zip(a.parameters(), c.parameters()))


def test_mamba2_decay_rates_in_documented_range():
    model = _model("mamba2")
    A = torch.exp(model.blocks[0].mixer.A_log)
    dt = torch.nn.functional.softplus(model.blocks[0].mixer.dt_bias)
    assert ((A >= 1) & (A <= 16)).all() and ((dt >= 1e-3 - 1e-12) & (dt <= 1e-1 + 1e-12)).all()


def test_unknown_mixer_and_impl_raise():
    with pytest.raises(ValueError, match="mixer must be one of"):
        RecurrentLM("lstm")
    with pytest.raises(ValueError, match="unknown impl .*; allowed: dispatch, ref"):
        RecurrentLM("gla", impl="triton")


@pytest.mark.parametrize("old", ["chunked", "sequential"])
@pytest.mark.parametrize("name", sorted(MIXERS))
def test_former_impl_names_are_unknown_values(name, old):
    with pytest.raises(DynlabInputError, match=rf"^unknown impl '{old}'; allowed: dispatch, ref$"):
        MIXERS[name](16, impl=old, **SMALL[name])


def test_public_api_is_pinned():
    import dynlab.lm

    assert sorted(dynlab.lm.__all__) == sorted([
        "Corpus", "decode", "encode", "load_corpus",
        "StreamResult", "next_token_probs", "stream_eval", "truncated_context_probs", "validation_windows",
        "INTERVENTIONS", "TBTT", "FittedNoise", "Intervention", "RandomNoise", "StatePassing", "ZeroInit",
        "make_intervention", "Batch", "RandomWindowLoader", "SequentialChunkLoader",
        "MIXERS", "GLAMixer", "Mamba1Mixer", "Mamba2Mixer", "VOCAB_SIZE", "RecurrentLM",
        "BABI_KINDS", "BabiTask", "CopyingTask", "PasskeyTask", "TaskBatch", "make_task",
        "TrainResult", "fit", "resolve_device", "train_lm",
    ])
    assert all(hasattr(dynlab.lm, name) for name in dynlab.lm.__all__)
