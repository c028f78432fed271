"""The LM studies from the shell: the ``smoke`` presets end to end, and the common knobs
(``--steps``, ``--d-model``, ``--n-layers``, ``--batch-size``, ``--lr``, ``--seq-len``,
``--config FILE.toml``) reaching the trained model."""

from __future__ import annotations

import json

import numpy as np
import pytest

from dynlab.cli import main
from dynlab.runner import open_study

LM_STUDIES = ("length-generalization", "copying", "passkey", "babilong")


@pytest.mark.parametrize("name", LM_STUDIES)
def test_smoke_preset_trains_end_to_end(tmp_path, capsys, name):
    """Every LM study's smoke preset trains, evaluates and writes a dataset whose runs are ok
    and whose training loss is below the loss of guessing a byte uniformly (ln 256)."""
    code = main(["study", name, "--preset", "smoke", "--out", str(tmp_path), "--device", "cpu", "-q"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    ds = open_study(tmp_path / name)
    assert ds.attrs["preset"] == "smoke"
    assert set(map(str, ds["status"].values)) == {"ok"}
    loss = np.asarray(ds["train_loss"].values, dtype=float)
    assert np.all(np.isfinite(loss)) and np.all(loss < np.log(256))
    if name != "length-generalization":  # the post-training arms ran too (every model counts as learned)
        assert "post" in set(map(str, ds["phase"].values))
