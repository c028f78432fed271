"""The ``size`` preset: its specs (sizes, budgets, annealed runs, stacks) and its map."""

from __future__ import annotations

import numpy as np
import pytest

from dynlab.lm.run.text import build_model, checkpoint_steps, count_parameters
from dynlab.lm.report.tables import size_grid, size_tables
from dynlab.studies.length_generalization import STUDY, make_specs
from dynlab.runner.protocol import StudyOptions


def test_size_preset_specs():
    specs = make_specs(StudyOptions(preset="size"))
    assert len(specs) == 4 * (2 + 2) * 3  # 4 sizes x (2 training lengths + 2 annealed budgets) x 3 seeds
    assert all(s.train.engine == "stack" and s.train.batch_size * s.train.seq_len == 2048 for s in specs)
    blocks = {s.model.d_model: count_parameters(build_model(s)) - 2 * 256 * s.model.d_model for s in specs}
    assert blocks == {8: 2670, 16: 6268, 32: 18168, 64: 60784} and blocks[64] / blocks[8] > 15
    for s in specs:
        n = count_parameters(build_model(s))
        budgets = s.eval.checkpoints
        top = max(budgets)
        # the run ends at its largest budget: its last checkpoint is the trained model
        assert checkpoint_steps(n, (top,), s.train.batch_size, s.train.seq_len, 10**9)[0] in (s.train.steps, s.train.steps - 1)
        if len(budgets) == 1:  # an annealed run: trained alone to its one budget, at T_train 32
            assert budgets[0] in (1.0, 4.0) and s.train.seq_len == 32
            assert checkpoint_steps(n, budgets, s.train.batch_size, 32, 10**9)[0] == s.train.steps
    tops = {s.model.d_model: max(s.eval.checkpoints) for s in specs if len(s.eval.checkpoints) > 1}
    assert tops == {8: 32.0, 16: 32.0, 32: 32.0, 64: 32.0}
    # one stack per (size, length or annealed budget): the 3 seeds train together
    assert len(STUDY.work_items(specs)) == 16 and all(len(item) == 3 for item in STUDY.work_items(specs))


def test_size_annealed_runs_are_the_size_recipe_trained_alone_to_each_named_budget():
    """size-annealed: no in-run run; each (width, T_train, budget) it names trained alone on
    seeds 0-2 with exactly the size preset's model, data, eval and training fields, the steps
    that end at the budget."""
    size = make_specs(StudyOptions(preset="size"))
    annealed = make_specs(StudyOptions(preset="size-annealed"))
    cells = sorted({(s.model.d_model, s.train.seq_len, s.eval.checkpoints) for s in annealed})
    assert cells == [(8, 32, (8.0,)), (8, 32, (16.0,)), (8, 128, (8.0,)), (16, 128, (2.0,)), (16, 128, (4.0,)),
                     (64, 32, (0.5,)), (64, 128, (0.5,))]
    assert len(annealed) == 3 * len(cells) and {s.seed for s in annealed} == {0, 1, 2}
    inrun = {(s.model.d_model, s.train.seq_len, s.seed): s for s in size if len(s.eval.checkpoints) > 1}
    for s in annealed:
        twin = inrun[(s.model.d_model, s.train.seq_len, s.seed)]
        assert (s.model, s.data, s.intervention) == (twin.model, twin.data, twin.intervention)
        assert s.eval == twin.eval.model_copy(update={"checkpoints": s.eval.checkpoints})
        n = count_parameters(build_model(s))
        assert s.train == twin.train.model_copy(update={"steps": checkpoint_steps(
            n, s.eval.checkpoints, s.train.batch_size, s.train.seq_len, 10**9)[0]})
    assert len(STUDY.work_items(annealed)) == len(cells)  # the 3 seeds of a cell train as one stack


@pytest.mark.slow
def test_size_grid_is_the_runs_values_on_a_grid(tmp_path):
    from dynlab.runner.driver import open_study, run_study

    extra = {"train": {"steps": 12}, "eval": {"length_multiple": 4, "n_samples": 4, "chunk_len": 32, "bin_width": 8,
                                             "effrem_points": 3, "effrem_samples": 2, "state_points": 4}}
    ds = open_study(run_study(STUDY, StudyOptions(preset="size", seeds=(0, 1), extra=extra), out=tmp_path, device="cpu"))
    m = size_grid(ds)
    text = size_tables(ds)
    assert text.count("| 64 (60,784) |") == 2 and "| 64 | 32 | 4× |" in text
    assert dict(m["inrun"].sizes) == {"budget": 7, "d_model": 4, "train_length": 2, "seed": 2}
    assert list(m["blocks"].values) == [2670, 6268, 18168, 60784]
    for i in range(ds.sizes["run"]):
        run = ds.isel(run=i)
        d, seed = int(run["d_model"]), int(run["seed"])
        values = run["far_over_in"]
        for b in values["budget"].values[np.isfinite(values.values)]:
            grid = m["alone"] if bool(run["annealed"]) else m["inrun"]
            got = grid.sel(d_model=d, train_length=int(run["train_length"]), seed=seed, budget=b)
            assert float(got) == float(values.sel(budget=b))
    assert np.isfinite(m["alone"].sel(train_length=32, budget=[1.0, 4.0])).all()
    assert np.isnan(m["alone"].sel(budget=0.5)).all() and np.isnan(m["alone"].sel(train_length=128)).all()


def test_size_grid_keeps_runs_trained_alone_where_no_checkpoint_run_is():
    """Runs trained alone on seeds and a T_train that no in-run run has stay in the grid
    (the union of the two), NaN in the other grid, never dropped."""
    import xarray as xr

    def runs(annealed, seeds, lengths, budgets):
        rows = [(s, t) for s in seeds for t in lengths]
        far = np.full((len(rows), len(budgets)), np.nan)
        for i in range(len(rows)):
            far[i, i % len(budgets) if annealed else slice(None)] = 1.0 + 0.01 * i
        return xr.Dataset({"far_over_in": (("run", "budget"), far)}, coords={
            "budget": budgets, "annealed": ("run", [annealed] * len(rows)), "d_model": ("run", [8] * len(rows)),
            "seed": ("run", [r[0] for r in rows]), "train_length": ("run", [r[1] for r in rows]),
            "n_params": ("run", [6766] * len(rows))})

    inrun = runs(False, (0, 1), (32,), [1.0, 2.0])
    alone = runs(True, (5, 6), (256,), [4.0])
    g = size_grid(xr.concat([inrun, alone], "run", join="outer"))
    assert sorted(g["seed"].values.tolist()) == [0, 1, 5, 6] and sorted(g["train_length"].values.tolist()) == [32, 256]
    assert int(np.isfinite(g["alone"]).sum()) == 2 and int(np.isfinite(g["inrun"]).sum()) == 4
    assert float(g["alone"].sel(d_model=8, seed=6, train_length=256, budget=4.0)) == 1.01


@pytest.mark.parametrize("flags", [["--seq-len", "64"], ["--config", "CHECKPOINTS"]])
def test_size_annealed_refuses_overrides_that_would_change_its_runs(tmp_path, capsys, flags):
    """A training length, or in-run checkpoints, would turn its named runs into others: one
    line, exit 2, nothing written."""
    from dynlab.cli import main

    if flags[1] == "CHECKPOINTS":
        (tmp_path / "c.toml").write_text("[eval]\ncheckpoints = [1.0, 2.0]\n")
        flags = ["--config", str(tmp_path / "c.toml")]
    out = tmp_path / "out"
    assert main(["study", "length-generalization", "--preset", "size-annealed", *flags, "--out", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "preset 'size-annealed'" in err[0] and "allowed:" in err[0]
    assert not out.exists()
