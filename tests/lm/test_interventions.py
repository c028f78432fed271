"""Initial-state interventions and loaders: fitted-noise EMA, SP resets, TBTT order."""

from __future__ import annotations

import math

import pytest
import torch

from dynlab.lm.train.interventions import TBTT, FittedNoise, RandomNoise, StatePassing, ZeroInit, make_intervention
from dynlab.lm.data.loaders import RandomWindowLoader, SequentialChunkLoader, sequential_tokens_read
from dynlab.lm.models.model import RecurrentLM
from dynlab.lm.train.engine import train_lm

SHAPES = [(2, 3, 4), (2, 3, 4)]  # two layers, H = 2, P = 3, N = 4


def _states_with(values_per_head: list[list[float]]) -> list[torch.Tensor]:
    """Layer-0 states whose head h holds the given values (cycled over B·P·N = 2·3·4 entries); layer 1 zeros."""
    heads = []
    for vals in values_per_head:
        heads.append(torch.tensor(vals * (24 // len(vals)), dtype=torch.float64).view(2, 3, 4))  # [B, P, N]
    layer0 = torch.stack(heads, dim=1)  # [B, H, P, N]
    return [layer0, torch.zeros_like(layer0)]


def test_fitted_noise_ema_matches_hand_sequence():
    fitted = FittedNoise(beta=0.1)
    fitted.observe(_states_with([[1.0, 3.0], [0.0, 0.0]]))  # head 0: mean 2, var 1
    assert fitted.mean[0].tolist() == pytest.approx([2.0, 0.0]) and fitted.var[0].tolist() == pytest.approx([1.0, 0.0])
    fitted.observe(_states_with([[5.0, 5.0], [2.0, 6.0]]))  # head 0: mean 5, var 0; head 1: mean 4, var 4
    # new statistic weighted 0.9, old 0.1
    assert fitted.mean[0].tolist() == pytest.approx([0.9 * 5 + 0.1 * 2, 0.9 * 4 + 0.1 * 0])
    assert fitted.var[0].tolist() == pytest.approx([0.9 * 0 + 0.1 * 1, 0.9 * 4 + 0.1 * 0])
    fitted.observe(_states_with([[-1.0, 1.0], [4.0, 4.0]]))  # head 0: mean 0, var 1; head 1: mean 4, var 0
    assert fitted.mean[0].tolist() == pytest.approx([0.9 * 0 + 0.1 * 4.7, 0.9 * 4 + 0.1 * 3.6])
    assert fitted.var[0].tolist() == pytest.approx([0.9 * 1 + 0.1 * 0.1, 0.9 * 0 + 0.1 * 3.6])


def test_fitted_noise_samples_follow_fitted_per_head_statistics():
    fitted = FittedNoise()
    g = torch.Generator().manual_seed(0)
    assert all(s.abs().sum() == 0 for s in fitted.initial_states(4, SHAPES, torch.ones(4, dtype=torch.bool), g))
    fitted.observe(_states_with([[1.0, 3.0], [-2.0, -2.0]]))
    samples = fitted.initial_states(4000, SHAPES, torch.zeros(4000, dtype=torch.bool), g)[0].double()  # [B, H, P, N]
    per_head = samples.transpose(0, 1).flatten(1)  # [H, B*P*N]
    assert per_head.mean(1).tolist() == pytest.approx([2.0, -2.0], rel=0, abs=0.02)
    assert per_head.std(1).tolist() == pytest.approx([1.0, 0.0], rel=0, abs=0.02)


def test_state_passing_reset_probability_per_layer_head_slot():
    sp = StatePassing(reset_prob=0.1)
    b = 500
    sp.observe([torch.ones(b, *s) for s in SHAPES])
    init = sp.initial_states(b, SHAPES, torch.ones(b, dtype=torch.bool), torch.Generator().manual_seed(0))
    blocks = torch.stack(init).flatten(3)  # [layer, B, H, P*N]
    per_block = blocks.mean(-1)  # [layer, B, H]
    assert set(per_block.unique().tolist()) <= {0.0, 1.0}  # a head of a slot is reset whole or kept whole
    rate = (per_block == 0).double().mean().item()
    n = per_block.numel()
    assert abs(rate - 0.1) < 5 * math.sqrt(0.1 * 0.9 / n)
    assert not torch.equal(per_block[0], per_block[1])  # independent per layer


def test_state_passing_starts_from_zero_and_ignores_fresh():
    sp = StatePassing(reset_prob=0.0)
    g = torch.Generator().manual_seed(0)
    assert all(s.abs().sum() == 0 for s in sp.initial_states(3, SHAPES, torch.ones(3, dtype=torch.bool), g))
    prev = [torch.full((3, *s), 2.0) for s in SHAPES]
    sp.observe(prev)
    for a, b in zip(sp.initial_states(3, SHAPES, torch.ones(3, dtype=torch.bool), g), prev):
        assert torch.equal(a, b)


def test_tbtt_loader_keeps_chunk_order_per_slot():
    data = torch.arange(10 * 3 * 4 + 5)  # lane S = 41 per slot for B = 3, L = 10 -> 4 chunks per lane
    loader = SequentialChunkLoader(data, batch_size=3, seq_len=10)
    batches = [next(loader) for _ in range(9)]
    lane = len(data) // 3
    for i, batch in enumerate(batches):
        chunk = i % 4
        expected = torch.arange(3)[:, None] * lane + chunk * 10 + torch.arange(11)
        assert torch.equal(batch.tokens, expected), f"step {i}"
        assert batch.fresh.tolist() == [chunk == 0] * 3
    for prev, nxt in zip(batches[:3], batches[1:4]):
        assert torch.equal(prev.tokens[:, -1], nxt.tokens[:, 0])  # chunk i+1 continues chunk i in every slot


@pytest.mark.parametrize("steps", [1, 3, 4, 9])
def test_the_tokens_a_tbtt_run_reads_are_those_its_loader_gives(steps):
    data = torch.arange(10 * 3 * 4 + 5)  # 4 chunks per lane: from 5 steps on, every lane wraps
    loader = SequentialChunkLoader(data, batch_size=3, seq_len=10)
    seen = {int(x) for _ in range(steps) for x in next(loader).tokens.flatten()}
    assert sequential_tokens_read(len(data), 3, 10, steps) == len(seen)


def test_tbtt_carries_state_and_resets_fresh_slots():
    tbtt = TBTT()
    prev = [torch.full((3, *s), 1.5) for s in SHAPES]
    tbtt.observe(prev)
    init = tbtt.initial_states(3, SHAPES, torch.tensor([False, True, False]), torch.Generator())
    assert init[0][0].eq(1.5).all() and init[0][1].eq(0).all() and init[1][2].eq(1.5).all()


def test_random_noise_and_zero():
    g = torch.Generator().manual_seed(0)
    noise = RandomNoise(sigma=0.3).initial_states(1000, SHAPES, torch.ones(1000, dtype=torch.bool), g)
    assert noise[0].std().item() == pytest.approx(0.3, rel=0.02, abs=1e-12) and abs(noise[0].mean().item()) < 0.005
    assert all(s.abs().sum() == 0 for s in ZeroInit().initial_states(2, SHAPES, torch.ones(2, dtype=torch.bool), g))


def test_random_window_loader_is_reproducible_and_aligned():
    data = torch.arange(1000)
    a = next(RandomWindowLoader(data, 4, 16, torch.Generator().manual_seed(1)))
    b = next(RandomWindowLoader(data, 4, 16, torch.Generator().manual_seed(1)))
    assert torch.equal(a.tokens, b.tokens)
    assert torch.equal(a.tokens, a.offsets[:, None] + torch.arange(17))


def test_train_loop_passes_each_steps_final_state_to_the_next_tbtt_step():
    class Spy(TBTT):
        def __init__(self) -> None:
            super().__init__()
            self.inits, self.finals = [], []

        def initial_states(self, batch_size, shapes, fresh, generator):
            out = super().initial_states(batch_size, shapes, fresh, generator)
            self.inits.append([s.clone() for s in out])
            return out

        def observe(self, final_states):
            super().observe(final_states)
            self.finals.append([s.clone() for s in final_states])

    model = RecurrentLM("mamba2", d_model=16, n_layers=1, n_heads=2, head_dim=4, d_state=4)
    spy = Spy()
    data = torch.randint(0, 256, (2000,), generator=torch.Generator().manual_seed(0)).to(torch.uint8)
    train_lm(model, data, spy, steps=3, batch_size=2, seq_len=8, device="cpu")
    assert all(s.abs().sum() == 0 for s in spy.inits[0])
    for step in (1, 2):
        torch.testing.assert_close(spy.inits[step][0], spy.finals[step - 1][0], rtol=0, atol=0)


def test_make_intervention_rejects_unknown_name():
    with pytest.raises(ValueError, match="intervention must be one of"):
        make_intervention("dropout")
    assert isinstance(make_intervention("state-passing", reset_prob=0.2), StatePassing)
