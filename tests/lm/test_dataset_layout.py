"""An LM run's dataset layout (each curve on its own positions), and the training-loss curve
with its ``converged`` rule."""

from __future__ import annotations

import numpy as np
import pytest

from dynlab.lm.dataset import result_to_dataset
from dynlab.results.assemble import training_curves
from dynlab.runner.protocol import RunResult
from dynlab.training import converged, loss_curve

from helpers.lm_results import lm_result


def test_each_curve_on_its_own_positions_with_no_padding():
    r = lm_result()
    ds = result_to_dataset(r)
    assert ds["ppl"].dims == ("t",) and ds["t"].values.tolist() == list(range(1, 41))
    assert ds["ppl_binned"].dims == ("t_bin",) and ds["t_bin"].values.tolist() == [8, 16, 24, 32, 40]
    assert ds["t_bin_start"].values.tolist() == [1, 9, 17, 25, 33]
    assert ds["effrem_js"].dims == ("t_effrem",) and ds["t_effrem"].values.tolist() == [0, 20, 39]
    assert ds["state_norm"].dims == ("layer", "head", "t_state") and ds["t_state"].values.tolist() == [1, 4, 16, 40]
    for name in ("ppl", "ppl_binned", "effrem", "state_std"):
        assert np.isfinite(ds[name]).all(), name
    np.testing.assert_array_equal(ds["state_std"].values, np.asarray(r["state_std"]))
    assert ds["t_bin"].attrs["units"] == "tokens" and ds["t_effrem"].attrs["long_name"]


def test_loss_curve_is_window_means_ending_at_the_last_step():
    losses = np.arange(1.0, 201.0)  # 200 steps, loss = step number
    steps, curve = loss_curve(losses.tolist(), points=8)
    assert steps == [25, 50, 75, 100, 125, 150, 175, 200]
    np.testing.assert_allclose(curve, [np.mean(losses[a - 25:a]) for a in steps], rtol=1e-12, atol=0)
    assert loss_curve([0.5, 0.25], points=64) == ([1, 2], [0.5, 0.25])  # fewer steps than points: each step
    assert loss_curve([]) == ([], [])
    steps, curve = loss_curve([1.0] * 101, points=64)
    assert len(steps) == 64 and steps[-1] == 101 and len(set(steps)) == 64


@pytest.mark.parametrize("losses, expected, why", [
    (4.0 * np.exp(-np.arange(400) / 40.0) + 1.0, True, "fell from 5 to ~1 and levelled off"),
    (np.full(400, 4.2), False, "never moved"),
    (np.linspace(5.0, 1.0, 400), False, "still falling steeply at the end"),
    (np.r_[np.full(200, 5.0), np.full(200, 4.8)], False, "fell by 4 % only"),
    (np.r_[4.0 * np.exp(-np.arange(399) / 40.0) + 1.0, np.nan], False, "a non-finite loss"),
    (np.full(10, 1.0), False, "too few steps to tell"),
])
def test_converged_rule(losses, expected, why):
    assert converged(list(losses)) is expected, why


_NOISE = np.random.default_rng(0).normal(0.0, 0.01, 300)  # 1 % batch noise


@pytest.mark.parametrize("losses, cold, warm, why", [
    (1.66 * (1 + _NOISE), False, True, "a post-training arm that starts at its end and stays level"),
    (np.r_[np.full(15, 3.5), 1.7 * (1 + _NOISE[15:])], True, True, "jumps at the start (noise), falls back, levels off"),
    (np.linspace(2.0, 1.0, 300), False, False, "still falling steeply at the end"),
    (np.linspace(1.0, 1.5, 300), False, False, "climbing all the way"),
    (np.r_[np.linspace(1.0, 1.5, 150), np.full(150, 1.5)], False, False, "rose by half, then levelled off"),
    (np.r_[1.66 * (1 + _NOISE[:299]), np.inf], False, False, "a non-finite loss"),
    (np.r_[np.full(270, 0.005), np.full(30, 0.012)], False, True, "near zero: 0.007 nats is level, though 2x"),
    (np.r_[np.full(270, 0.005), np.full(30, 0.05)], False, False, "near zero, then up by 0.045 nats"),
])
def test_converged_rule_of_a_warm_start(losses, cold, warm, why):
    assert converged(list(losses)) is cold, why
    assert converged(list(losses), warm_start=True) is warm, why


def test_training_curves_give_each_run_its_own_steps():
    runs = [RunResult(status="ok", loss_curve_step=[10, 20, 30], loss_curve=[3.0, 2.0, 1.5], converged=True),
            RunResult(status="ok", loss_curve_step=[5, 10], loss_curve=[4.0, 3.9], converged=False),
            RunResult(status="diverged")]
    ds = training_curves(runs)
    np.testing.assert_array_equal(ds["train_step"].values, [[10, 20, 30], [5, 10, np.nan], [np.nan] * 3])
    np.testing.assert_array_equal(ds["train_loss_curve"].values, [[3.0, 2.0, 1.5], [4.0, 3.9, np.nan], [np.nan] * 3])
    assert ds["converged"].values.tolist() == [True, False, False]
    assert "fell" in ds["converged"].attrs["rule"] and ds["train_loss_curve"].attrs["units"] == "nats/token"
    assert training_curves([RunResult(status="ok")]).data_vars == {}


def test_converged_flags_recompute_from_the_stored_curves():
    """converged_flags reads each run's points up to its last step and judges phase 'post'
    runs as warm starts: the flags training_curves stores for these results."""
    from dynlab.results.assemble import converged_flags

    level = (1.66 * (1 + _NOISE[:64])).tolist()  # a warm arm's curve: level, no fall
    fall = (4.0 * np.exp(-np.arange(40) / 5.0) + 1.0).tolist()  # a cold run: fell and levelled off
    runs = [RunResult(status="ok", loss_curve_step=list(range(1, 65)), loss_curve=level, converged=False),
            RunResult(status="ok", loss_curve_step=list(range(1, 65)), loss_curve=level, converged=True),
            RunResult(status="ok", loss_curve_step=list(range(1, 41)), loss_curve=fall, converged=True)]
    ds = training_curves(runs).assign_coords(phase=("run", ["base", "post", "base"]))
    assert np.isnan(ds["train_step"].values[2, 40:]).all()  # the shorter run is padded
    np.testing.assert_array_equal(converged_flags(ds), [False, True, True])
    np.testing.assert_array_equal(converged_flags(ds.drop_vars("phase")), [False, False, True])  # no phase: cold
    bad = ds.copy(deep=True)
    bad["train_loss_curve"][2, 39] = np.nan  # a non-finite point before the run's end is not padding
    assert not converged_flags(bad)[2]
