"""Long-context evaluation: windows read lazily from a token stream (a memory map too), the
per-position mean NLL kept instead of every window's, PPL(t) on log-spaced bins."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
import xarray as xr

from dynlab.lm.analysis.metrics import log_bin_ends, log_binned_ppl, position_ppl
from dynlab.lm.evaluate import stream_eval, stream_windows, validation_windows
from dynlab.lm.models.model import RecurrentLM


def _model(vocab: int = 256) -> RecurrentLM:
    return RecurrentLM("mamba2", d_model=16, n_layers=2, n_heads=2, head_dim=4, d_state=4, chunk_size=8,
                       vocab_size=vocab, generator=torch.Generator().manual_seed(0)).double()


def _memmap(tmp_path, ids: np.ndarray) -> np.ndarray:
    path = tmp_path / "val.bin"
    ids.astype(np.uint16).tofile(path)
    return np.memmap(path, dtype=np.uint16, mode="r", shape=(len(ids),))


def test_lazy_windows_of_a_memory_map_are_the_materialized_windows(tmp_path):
    ids = np.random.default_rng(0).integers(0, 300, 5000)
    val = _memmap(tmp_path, ids)
    lazy = stream_windows(val, 5, 700)
    full = validation_windows(torch.as_tensor(ids), 5, 700)
    assert lazy.shape == tuple(full.shape)
    assert torch.equal(lazy.to("cpu"), full)
    assert torch.equal(lazy[1:3, 10:50].to("cpu"), full[1:3, 10:50])
    assert torch.equal(lazy[:, 650:].to(), full[:, 650:])


@pytest.mark.parametrize("chunk_len", [16, 33])
def test_streamed_mean_nll_from_a_memory_map_equals_the_whole_forward(tmp_path, chunk_len):
    """keep='mean' over lazy windows gives the row mean of keep='all' (the same bits) and the
    whole-sequence forward's per-position mean NLL (to float64 rounding)."""
    model = _model(300)
    ids = np.random.default_rng(1).integers(0, 300, 4000)
    lazy = stream_windows(_memmap(tmp_path, ids), 4, 200)
    full = validation_windows(torch.as_tensor(ids), 4, 200)
    mean = stream_eval(model, lazy, chunk_len=chunk_len, keep="mean", record_at=[5, 50, 199])
    every = stream_eval(model, full, chunk_len=chunk_len, record_at=[5, 50, 199])
    assert mean.nll.shape == (1, 200) and every.nll.shape == (4, 200)
    assert np.array_equal(mean.nll[0], every.nll.mean(axis=0))
    assert np.array_equal(position_ppl(mean.nll).values, position_ppl(every.nll).values)
    with torch.no_grad():
        logits, _ = model(full[:, :-1])
    whole = F.cross_entropy(logits.transpose(1, 2), full[:, 1:], reduction="none").mean(0).numpy()
    np.testing.assert_allclose(mean.nll[0], whole, rtol=0, atol=1e-10)
    xr.testing.assert_allclose(mean.state_stats, every.state_stats)


def test_log_binned_ppl_pools_the_nll_of_each_bin():
    rng = np.random.default_rng(2)
    length = 1000
    nll = rng.uniform(0.5, 3.0, length)
    ppl = position_ppl(nll[None, :])
    out = log_binned_ppl(ppl, 20)
    ends = log_bin_ends(length, 20)
    assert out["t_log"].values.tolist() == ends.tolist() and ends[0] == 1 and ends[-1] == length
    prev = 0
    for k, end in enumerate(ends):  # a loop over each bin's positions: prev < t <= end
        assert out.values[k] == pytest.approx(np.exp(nll[prev:end].mean()), rel=1e-12)
        prev = end
    assert out.attrs["units"] == "1" and out["t_log"].attrs["units"] == "tokens"


def test_log_bins_reach_128k_and_keep_other_dims():
    length = 131_072
    ends = log_bin_ends(length, 48)
    assert ends[-1] == length and np.all(np.diff(ends) > 0) and len(ends) <= 48
    curves = xr.DataArray(np.full((2, length), 3.0), dims=("run", "t"),
                          coords={"run": [0, 1], "t": np.arange(1, length + 1)})
    out = log_binned_ppl(curves, 48)
    assert out.dims == ("run", "t_log") and np.allclose(out.values, 3.0)
    with pytest.raises(ValueError, match="t = 1..T"):
        log_binned_ppl(curves.isel(t=slice(1, None)))
