"""The dataset layout of earlier versions read as the current one (dynlab.results.layout):
a language-model dataset with every curve on one shared ``t``, split onto each curve's own
positions, by hand and by ``open_dataset``, with the same numbers."""

from __future__ import annotations

import numpy as np
import xarray as xr

from dynlab.lm.dataset import result_to_dataset
from dynlab.report.lm import far_in_ratio
from dynlab.results.layout import current_layout, split_positions
from dynlab.results.schema import open_dataset

from helpers.lm_results import lm_result, shared_t

CURVES = ("ppl", "ppl_binned", "effrem", "effrem_js", "effrem_cos", "state_mean", "state_std", "state_norm")


def test_split_positions_of_the_old_layout_equals_the_new_one():
    rs = [lm_result(seed=s) for s in range(3)]
    old = xr.concat([shared_t(r) for r in rs], dim="run")
    new = xr.concat([result_to_dataset(r) for r in rs], dim="run")
    got = split_positions(old)
    for name in CURVES:
        assert got[name].dims == new[name].dims, name
        np.testing.assert_array_equal(got[name].values, new[name].values)
    for c in ("t", "t_bin", "t_bin_start", "t_effrem", "t_state"):
        np.testing.assert_array_equal(got[c].values, new[c].values)
    assert split_positions(new) is new  # already split: unchanged


def _old_study_file(tmp_path, rs):
    """A study dataset of runs ``rs`` as earlier versions wrote it: the curves on one ``t``,
    with the run record the report reads (p*, the training length)."""
    old = xr.concat([shared_t(r) for r in rs], dim="run")
    old = old.assign(lg_p_star=("run", [r["verdict"]["p_star"] for r in rs]))
    old = old.assign_coords(train_length=("run", [16] * len(rs)), seed=("run", list(range(len(rs)))))
    path = tmp_path / "dataset.nc"
    old.to_netcdf(path, engine="netcdf4")
    return path


def test_open_dataset_reads_an_old_layout_file_in_the_current_one_with_the_same_numbers(tmp_path):
    rs = [lm_result(n=64, seed=s) for s in range(2)]
    ds = open_dataset(_old_study_file(tmp_path, rs))
    assert ds["ppl_binned"].dims == ("run", "t_bin") and ds["state_std"].dims == ("run", "layer", "head", "t_state")
    assert ds["effrem"].dims == ("run", "t_effrem") and ds["ppl"].dims == ("run", "t")
    new = xr.concat([result_to_dataset(r) for r in rs], dim="run")
    for name in CURVES:
        np.testing.assert_array_equal(ds[name].values, new[name].values)
    # far/in, computed here from the result.json values: the mean binned PPL over the bins
    # ending in the last eighth (56, 64] of the evaluation length, over p*
    for i, r in enumerate(rs):
        ends, binned = np.asarray(r["ppl_binned_t"]), np.asarray(r["ppl_binned"])
        want = binned[ends > 56].mean() / r["verdict"]["p_star"]
        np.testing.assert_allclose(far_in_ratio(ds).values[i], want, rtol=1e-12, atol=0)


def test_a_dataset_without_language_model_curves_is_left_as_it_is():
    """A word-problem dataset's curves are on ``t`` as they should be: not an old layout."""
    ds = xr.Dataset({"R": (("run", "t"), np.ones((2, 5))), "mp": ("run", [10.0, 20.0])}, coords={"t": np.arange(5)})
    assert current_layout(ds) is ds
    bare = xr.Dataset({"mp": ("run", [10.0, 20.0])}, coords={"t": np.arange(5)})  # a cut-down one, its curves gone
    assert current_layout(bare) is bare
