"""Streaming evaluation: equals a whole-sequence forward, bounded chunk size, state recording."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from dynlab.lm.evaluate import stream_eval, validation_windows
from dynlab.lm.models.model import RecurrentLM


def _model(name="mamba2"):
    kwargs = {"mamba2": dict(n_heads=2, head_dim=4, d_state=4), "gla": dict(n_heads=2, key_dim=4, value_dim=4),
              "mamba1": dict(d_inner=8, d_state=4, n_heads=2)}[name]
    return RecurrentLM(name, d_model=16, n_layers=2, generator=torch.Generator().manual_seed(0), **kwargs)


@pytest.mark.parametrize("name", ["mamba2", "mamba1", "gla"])
@pytest.mark.parametrize("chunk_len", [7, 64], ids=lambda c: f"chunk{c}")
def test_streamed_nll_equals_whole_forward(name, chunk_len):
    model = _model(name).double()
    tokens = torch.randint(0, 256, (3, 51), generator=torch.Generator().manual_seed(2))
    res = stream_eval(model, tokens, chunk_len=chunk_len)
    with torch.no_grad():
        logits, finals = model(tokens[:, :-1])
    expected = F.cross_entropy(logits.transpose(1, 2), tokens[:, 1:], reduction="none").numpy()
    assert res.nll.shape == (3, 50)
    assert abs(res.nll - expected).max() < 1e-10
    stats = res.state_stats
    assert stats["t"].values.tolist() == list(range(chunk_len, 50, chunk_len)) + ([50] if 50 % chunk_len else [])
    last = finals[1].flatten(2)  # [S, H, P*N] final states of layer 1
    expected_norm = last.norm(dim=2).mean(dim=0).numpy()  # [H]
    expected_std = last.transpose(0, 1).flatten(1).std(dim=1, unbiased=False).numpy()  # [H]
    assert abs(stats.state_norm.sel(layer=1).isel(t=-1).values - expected_norm).max() < 1e-5
    assert abs(stats.state_std.sel(layer=1).isel(t=-1).values - expected_std).max() < 1e-5


@pytest.mark.slow
def test_stream_never_feeds_more_than_chunk_len_tokens_at_16x_training_length():
    model = _model()
    seen: list[int] = []
    for block in model.blocks:
        block.mixer.register_forward_hook(lambda mod, args, out: seen.append(args[0].shape[1]))
    train_length, chunk_len = 32, 16
    tokens = torch.randint(0, 256, (2, 16 * train_length + 1), generator=torch.Generator().manual_seed(0))
    res = stream_eval(model, tokens, chunk_len=chunk_len, record_states=False)
    assert res.nll.shape == (2, 16 * train_length) and res.state_stats is None
    assert max(seen) == chunk_len and len(seen) == 2 * 16 * train_length // chunk_len


def test_validation_windows_are_deterministic_and_in_range():
    val = torch.arange(100).to(torch.uint8)
    w = validation_windows(val, 4, 20)
    assert w.shape == (4, 21) and w[0, 0] == 0 and w[-1, -1] == 99
    assert torch.equal(w, validation_windows(val, 4, 20))
    with pytest.raises(ValueError, match="evaluation length"):
        validation_windows(val, 2, 100)


def test_state_statistics_recorded_at_requested_positions_from_t1():
    model = RecurrentLM("mamba2", d_model=16, n_layers=2, n_heads=2, head_dim=4, d_state=4, chunk_size=4,
                        generator=torch.Generator().manual_seed(0)).eval()
    tokens = torch.randint(0, 256, (3, 21), generator=torch.Generator().manual_seed(1))
    res = stream_eval(model, tokens, chunk_len=8, record_at=[1, 3, 10, 20, 99])
    assert res.state_stats["t"].values.tolist() == [1, 3, 10, 20]  # 99 lies beyond the 20 positions
    whole = stream_eval(model, tokens, chunk_len=64, record_states=False).nll
    torch.testing.assert_close(torch.as_tensor(res.nll), torch.as_tensor(whole), rtol=1e-6, atol=1e-6)
    with torch.no_grad():
        _, states = model(tokens[:, :3])  # independent: the states after 3 tokens, one forward call
    direct = states[1][:, 0].double().flatten(1)  # layer 1, head 0: [S, P*N]
    assert res.state_stats.state_norm.sel(t=3, layer=1, head=0).item() == pytest.approx(direct.norm(dim=1).mean().item(), rel=1e-5, abs=1e-12)
    assert res.state_stats.state_std.sel(t=3, layer=1, head=0).item() == pytest.approx(direct.std(unbiased=False).item(), rel=1e-5, abs=1e-12)
