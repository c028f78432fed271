"""Each run's curve on its own positions (dynlab.results.positions.curves): a study's runs share
each position axis, a run's curve NaN beyond its own evaluation length and off its own grid;
``curves`` gives back exactly each run's values, unpadded, with ``t_rel`` = t / T_train, and the
snippet of docs/usage.md that draws them draws a line per run."""

from __future__ import annotations

import re

import matplotlib

matplotlib.use("Agg")

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pytest  # noqa: E402
from matplotlib.collections import QuadMesh  # noqa: E402
from matplotlib.lines import Line2D  # noqa: E402

from dynlab.lm.dataset import result_to_dataset  # noqa: E402
from dynlab.results import curves, open_dataset  # noqa: E402
from dynlab.results.assemble import stack_runs  # noqa: E402
from dynlab.results.positions import POSITION_AXES  # noqa: E402

from helpers.lm_results import lm_result  # noqa: E402
from helpers.paths import REPO  # noqa: E402

DATASETS = REPO / "benchmarks" / "results" / "datasets"


@pytest.fixture(scope="module")
def context():
    return open_dataset(DATASETS / "length-generalization-context.nc")


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def _own_values(a: np.ndarray) -> np.ndarray:
    """``a`` (one run's array) cut, along every axis, to the indices holding a finite value."""
    keep = [np.flatnonzero(np.isfinite(a).any(axis=tuple(j for j in range(a.ndim) if j != i))) for i in range(a.ndim)]
    return a[np.ix_(*keep)]


def _check_against_numpy(ds, name):
    """curves(ds, name) against the stored array read with numpy: the same finite values, no NaN
    left, the positions where the run has a value, t_rel = t / train_length."""
    got = curves(ds, name)
    axis = POSITION_AXES[name]
    stored = ds[name].transpose("run", ...)
    pos_axis = stored.dims.index(axis) - 1
    runs = [r for r in range(ds.sizes["run"]) if np.isfinite(stored.values[r]).any()]
    assert [int(c["run"]) for c in got] == runs
    for c in got:
        r = int(c["run"])
        a = stored.values[r]
        assert c.dims == stored.dims[1:], name
        assert not np.isnan(c.values).any(), (name, r)
        np.testing.assert_array_equal(np.sort(c.values, axis=None), np.sort(a[np.isfinite(a)]))
        np.testing.assert_array_equal(c.values, _own_values(a))
        finite_at = np.isfinite(a).any(axis=tuple(j for j in range(a.ndim) if j != pos_axis))
        np.testing.assert_array_equal(c[axis].values, ds[axis].values[finite_at])
        np.testing.assert_allclose(c["t_rel"].values, ds[axis].values[finite_at] / float(ds["train_length"][r]),
                                   rtol=0, atol=0)
        assert c["run_id"].item() == ds["run_id"].values[r] and c["t_rel"].attrs["units"] == "1"
    return got


@pytest.mark.parametrize("name", list(POSITION_AXES))
def test_the_committed_context_dataset_gives_each_run_its_own_values(context, name):
    stored = context[name].values
    assert np.isnan(stored).mean() > 0.5  # the shared grid: most of it is other runs' positions
    got = _check_against_numpy(context, name)
    assert len(got) == context.sizes["run"] == 24
    if name == "ppl_binned":  # 16 bins of 16 tokens to 16 x T_train: t_rel = 1 ... 16 for T_train = 16
        assert [c.sizes["t_bin"] for c in got[:12:3]] == [16, 32, 64, 128]
        np.testing.assert_array_equal(got[0]["t_rel"].values, np.arange(1, 17))
        np.testing.assert_array_equal(got[9]["t_rel"].values, np.arange(1, 129) / 8)


def test_the_committed_size_dataset_leaves_out_the_checkpoints_a_run_did_not_make():
    ds = open_dataset(DATASETS / "length-generalization-size.nc")
    got = _check_against_numpy(ds, "ppl_binned")
    assert [c.sizes["budget"] for c in got[:12]] == [7] * 6 + [1] * 6  # 0.5 ... 32 inside one run; trained alone
    assert {c.sizes["t_bin"] for c in got} == {32, 128}


def _two_lengths():
    """Three runs as the study stacks them: 40 and 80 tokens evaluated (T_train 10 and 20),
    their EffRem and state grids interleaved, and a run without results (all NaN)."""
    short, long_ = lm_result(n=40, seed=0), lm_result(n=80, seed=1)
    long_["effrem_t"], long_["state_t"] = [0, 40, 79], [1, 8, 32, 80]
    ds = stack_runs([result_to_dataset(short), None, result_to_dataset(long_)])
    ds = ds.assign_coords(run=[0, 1, 2], train_length=("run", [10, 10, 20]), run_id=("run", ["a", "b", "c"]))
    return ds, {"a": short, "c": long_}


def test_a_small_stacked_dataset_gives_back_each_result_unpadded():
    ds, results = _two_lengths()
    before = ds.copy(deep=True)
    assert ds.sizes["t"] == 80 and ds["t_effrem"].values.tolist() == [0, 20, 39, 40, 79]
    assert np.isnan(ds["ppl_binned"].values[0, 5:]).all()  # padded beyond the short run's 40 tokens
    for name in POSITION_AXES:
        _check_against_numpy(ds, name)
    grids = {"ppl": "t", "ppl_binned": "ppl_binned_t", "effrem_js": "effrem_t", "state_std": "state_t"}
    for name, grid in grids.items():
        got = curves(ds[name])  # a DataArray: its run coordinates are on it
        assert [c["run_id"].item() for c in got] == ["a", "c"]  # the run without results is left out
        for c in got:
            r = results[c["run_id"].item()]
            want = r["effrem"]["js"] if name == "effrem_js" else r[name]
            positions = range(1, len(r["ppl"]) + 1) if grid == "t" else r[grid]
            np.testing.assert_array_equal(c.values, np.asarray(want))
            np.testing.assert_array_equal(c[POSITION_AXES[name]].values, list(positions))
            np.testing.assert_array_equal(c["t_rel"].values, np.asarray(list(positions)) / int(c["train_length"]))
    assert ds.identical(before)  # pure: the dataset is left as it was


def test_one_run_and_refusals():
    single = result_to_dataset(lm_result())
    (c,) = curves(single, "ppl_binned")  # no run dim, no train_length: the curve as it is, no t_rel
    assert c.identical(single["ppl_binned"]) and "t_rel" not in c.coords
    with pytest.raises(TypeError, match="needs the name of a curve"):
        curves(single)
    with pytest.raises(ValueError, match="exactly one position dim"):
        curves(single, "lg_p_star")


def _usage_snippet() -> str:
    """The block of docs/usage.md that draws a line per run with ``curves``."""
    text = (REPO / "docs" / "usage.md").read_text(encoding="utf-8")
    blocks = [b for b in re.findall(r"```python\n(.*?)```", text, flags=re.S) if "curves(ds" in b]
    assert len(blocks) == 1, blocks
    return blocks[0]


def test_the_usage_snippet_draws_a_line_per_run_on_t_over_t_train(context):
    snippet = _usage_snippet()
    assert "for c in curves(ds, \"ppl_binned\"): c.plot(x=\"t_rel\"" in snippet
    plt.figure()
    exec(snippet, {"ds": context})  # noqa: S102 - the documented lines, as written
    ax = plt.gca()
    lines = [a for a in ax.get_children() if isinstance(a, Line2D) and len(a.get_xdata())]
    assert len(lines) == 24 and not ax.images and not any(isinstance(a, QuadMesh) for a in ax.collections)
    for line, c in zip(lines, curves(context, "ppl_binned")):
        np.testing.assert_array_equal(line.get_xdata(), c["t_rel"].values)
        np.testing.assert_array_equal(line.get_ydata(), c.values)
        assert np.isfinite(line.get_ydata()).all()
    assert ax.get_xscale() == "log"


def test_what_the_usage_doc_says_the_stored_grid_draws(context):
    """``ds.ppl_binned.plot()`` of a study is a heatmap; one run's, and ``plot.line(hue="run")``, lines."""
    plt.figure()
    context.ppl_binned.plot()
    assert any(isinstance(a, QuadMesh) for a in plt.gca().collections)
    plt.figure()
    context.ppl_binned.isel(run=0).plot()
    assert len(plt.gca().lines) == 1 and not plt.gca().collections
    plt.figure()
    context.ppl_binned.plot.line(x="t_bin", hue="run")
    assert len(plt.gca().lines) == 24 and not plt.gca().collections
