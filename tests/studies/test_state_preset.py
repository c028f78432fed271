"""The ``state`` preset: its grid (state sizes × training lengths at one token budget, seeds
stacked) and the forgetting it adds to the dataset (forget_rate, memory_horizon)."""

from __future__ import annotations

import numpy as np
import pytest

from dynlab.lm.run.text import build_model, count_parameters
from dynlab.studies.length_generalization import STUDY, make_specs
from dynlab.studies.length_generalization_presets import STATE_TOKENS
from dynlab.runner.protocol import StudyOptions


def test_state_preset_specs():
    specs = make_specs(StudyOptions(preset="state"))
    assert len(specs) == 4 * 6 * 3  # 4 state sizes x 6 training lengths x 3 seeds
    states = sorted({s.model.n_layers * s.model.n_heads * s.model.head_dim * s.model.d_state for s in specs})
    assert states == [1024, 4096, 16384, 65536] and states[-1] / states[0] >= 16
    assert {s.model.d_model for s in specs} == {32} and {s.train.seq_len for s in specs} == {16, 32, 64, 128, 256, 512}
    # every run sees the same tokens, 2 048 a step, and is one annealed run (no in-run checkpoints)
    assert {s.train.steps * s.train.batch_size * s.train.seq_len for s in specs} == {STATE_TOKENS}
    assert all(s.train.batch_size * s.train.seq_len == 2048 and not s.eval.checkpoints for s in specs)
    assert {s.eval_length for s in specs if s.train.seq_len == 512} == {8192}
    params = {s.model.d_state: count_parameters(build_model(s)) for s in specs}
    assert params[8] < params[32] < params[128] < params[512] < 4 * params[8]  # only B, C (and their conv) grow
    assert len(STUDY.work_items(specs)) == 24 and all(len(item) == 3 for item in STUDY.work_items(specs))


@pytest.mark.slow
def test_state_dataset_holds_each_runs_forgetting(tmp_path):
    import torch

    from dynlab.lm.hub.checkpoint import load_checkpoint
    from dynlab.lm.analysis.contraction import forgetting
    from dynlab.lm.data.loaders import take
    from dynlab.lm.run.text import data_corpus
    from dynlab.runner.driver import open_study, run_study

    extra = {"train": {"steps": 3, "seq_len": 16}, "eval": {"n_samples": 2, "chunk_len": 16, "bin_width": 8,
                                                            "effrem_points": 2, "effrem_samples": 2, "state_points": 4}}
    folder = run_study(STUDY, StudyOptions(preset="state", seeds=(0,), extra=extra), out=tmp_path, device="cpu")
    ds = open_study(folder)
    assert sorted(ds["state_size"].values.tolist()) == [1024, 4096, 16384, 65536]
    assert ds["memory_horizon"].attrs["units"] == "tokens" and ds["forget_rate"].attrs["units"] == "1/token"
    assert np.all(ds["forget_rate"].values < 0) and np.allclose(ds["memory_horizon"], -1 / ds["forget_rate"])
    run = ds.isel(run=int(np.argmax(ds["d_state"].values)))  # recomputed from the stored weights, alone
    model, _ = load_checkpoint(folder.parent / "runs" / str(run["run_id"].values))
    spec = make_specs(StudyOptions(preset="state", seeds=(0,), extra=extra))[0]
    val = data_corpus(spec.data).val
    starts = torch.linspace(0, len(val) - 257, 8).long()
    alone = forgetting(model, take(val, starts[:, None] + torch.arange(256)))
    assert float(run["forget_rate"]) == pytest.approx(float(alone["forget_rate"]), rel=1e-9)
