"""Length-generalization figures: far/in vs budget (the size preset, run tiny), the context
ladder, the intervention forest plot, and every committed LM dataset through `dynlab figures`."""

from __future__ import annotations


import matplotlib
import numpy as np
import pytest
import xarray as xr

matplotlib.use("Agg")
from matplotlib.collections import PolyCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402

from dynlab.lm.figures.panels import far_in_budget_panel, length_generalization_panels  # noqa: E402

from helpers.figure_checks import clipped_titles as _clipped_titles  # noqa: E402
from helpers.paths import REPO  # noqa: E402

DATASETS = REPO / "benchmarks" / "results" / "datasets"
SIZE_EXTRA = {"train": {"steps": 30}, "eval": {"length_multiple": 4, "n_samples": 4, "chunk_len": 32, "bin_width": 8,
                                              "effrem_points": 3, "effrem_samples": 2, "state_points": 4}}


def _ax():
    return Figure(figsize=(3.4, 2.5)).add_subplot()


def _bands(ax) -> list[PolyCollection]:
    return [c for c in ax.collections if isinstance(c, PolyCollection)]


@pytest.fixture(scope="module")
def size_ds(tmp_path_factory):
    """The size preset, tiny (30 steps, seeds 0 and 1): dims run × budget (about a minute)."""
    from dynlab.runner.driver import open_study, run_study
    from dynlab.studies.length_generalization import STUDY
    from dynlab.runner.protocol import StudyOptions

    out = tmp_path_factory.mktemp("size")
    path = run_study(STUDY, StudyOptions(preset="size", seeds=(0, 1), extra=SIZE_EXTRA), out=out, device="cpu")
    return open_study(path).load()


@pytest.mark.slow
def test_far_in_budget_on_the_size_preset(size_ds, tmp_path):
    ds = size_ds
    assert "budget" in ds.dims and {"d_model", "train_length", "seed", "annealed"} <= set(ds.coords)
    ax = far_in_budget_panel(ds, _ax())
    assert ax.get_ylabel() == "far PPL / PPL in (T_train/2, T_train]"  # far_over_in is the one read
    assert ax.get_xscale() == "log"
    ladder = ~ds["annealed"].values.astype(bool)
    combos = sorted({(int(d), int(t)) for d, t in zip(ds["d_model"].values[ladder], ds["train_length"].values[ladder])})
    assert len(combos) == 8  # 4 sizes x 2 training lengths
    lines = {ln.get_label(): ln for ln in ax.get_lines() if not ln.get_label().startswith("_")}
    assert sorted(lines) == sorted(f"d_model {d}, T_train {t}" for d, t in combos)
    # each line is the mean over seeds of far_over_in at the budgets it was checkpointed at
    for d, t in combos:
        runs = np.flatnonzero(ladder & (ds["d_model"].values == d) & (ds["train_length"].values == t))
        assert len(runs) == 2
        expected = ds["far_over_in"].values[runs].mean(axis=0)
        keep = np.isfinite(expected)
        x, y = lines[f"d_model {d}, T_train {t}"].get_data()
        np.testing.assert_allclose(x, ds["budget"].values[keep])
        np.testing.assert_allclose(y, expected[keep])
    assert len(_bands(ax)) == 8  # one min-max band per line (2 seeds each)
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "band: min–max over seeds" in labels and any(lab.startswith("annealed run") for lab in labels)
    # every annealed run is a marker at its own budget, at its value
    marks = [ln for ln in ax.get_lines() if ln.get_label() == "_annealed"]
    annealed = np.flatnonzero(~ladder)
    assert len(marks) == len(annealed) == 16
    got = sorted((float(m.get_xdata()[0]), float(m.get_ydata()[0])) for m in marks)
    want = []
    for i in annealed:
        v = ds["far_over_in"].values[i]
        (j,) = np.flatnonzero(np.isfinite(v))
        want.append((float(ds["budget"].values[j]), float(v[j])))
    np.testing.assert_allclose(got, sorted(want))
    # the whole figure set draws, the new panel among it
    from dynlab.figures import write_figures

    figs = write_figures(ds, tmp_path, length_generalization_panels)
    assert figs.skipped == {} and (tmp_path / "far_in_budget.png").exists()


@pytest.mark.slow
def test_the_committed_budget_dataset_draws_far_over_in_and_an_older_one_far_in_ratio(tmp_path):
    """The budget ladder reads far_over_in (one in-range reference for every T_train); a
    dataset written before it existed falls back to far_in_ratio (over p*)."""
    from dynlab.cli import main

    path = DATASETS / "length-generalization-budget.nc"
    ds = xr.open_dataset(path)
    for data, name, label in ((ds, "far_over_in", "far PPL / PPL in (T_train/2, T_train]"),
                              (ds.drop_vars("far_over_in"), "far_in_ratio", "far PPL / p*")):
        ax = far_in_budget_panel(data, _ax())
        assert ax.get_ylabel() == label
        (line,) = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
        np.testing.assert_allclose(line.get_ydata(), data[name].mean("run").values, rtol=1e-12, atol=0)
    assert main(["figures", str(path), "--out", str(tmp_path)]) == 0
    assert (tmp_path / "far_in_budget.png").exists() and (tmp_path / "ppl.png").exists()


def test_context_ladder_one_line_per_size_at_the_seed_means():
    from dynlab.lm.figures.panels import context_ladder_panel

    ds = xr.open_dataset(DATASETS / "length-generalization-context.nc")
    panels = length_generalization_panels(ds)
    assert "context_ladder" in panels and "far_in_budget" not in panels
    ax = context_ladder_panel(ds, _ax())
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    assert [ln.get_label() for ln in lines] == ["d_model 16 (14.5k params)", "d_model 32 (27.9k params)"]
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "training length T_train [tokens]"
    # the ratio against one in-range reference for every T_train, where the dataset has it
    ratio, label = (("far_over_in", "far PPL / PPL in (T_train/2, T_train]") if "far_over_in" in ds
                    else ("far_in_ratio", "far PPL / p*"))
    assert ax.get_ylabel() == label
    for line, d in zip(lines, (16, 32)):
        x, y = line.get_data()
        np.testing.assert_array_equal(x, [16, 32, 64, 128])
        for t, v in zip(x, y):
            runs = (ds["d_model"].values == d) & (ds["train_length"].values == t)
            assert runs.sum() == 3
            assert v == pytest.approx(ds[ratio].values[runs].mean())
    assert len(_bands(ax)) == 2
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "band: min–max over seeds" in labels and "one seed" in labels


def test_holm_matches_a_hand_computation():
    from dynlab.lm.figures.panels import holm

    # sorted 0.01, 0.03, 0.04 -> 3*0.01, max(2*0.03, .03), max(1*0.04, .06); NaN untouched, not counted
    np.testing.assert_allclose(holm(np.array([0.04, 0.01, np.nan, 0.03])), [0.06, 0.03, np.nan, 0.06])
    np.testing.assert_allclose(holm(np.array([[0.5, 0.9]])), [[1.0, 1.0]])


@pytest.mark.parametrize("name", ["length-generalization-interventions.nc", "length-generalization-interventions-no-conv.nc"])
def test_interventions_one_colour_per_arm_and_a_forest_plot(name, tmp_path):
    from dynlab.lm.figures.panels import contrast_forest_panel, holm, ppl_panel

    ds = xr.open_dataset(DATASETS / name)
    ax = ppl_panel(ds, _ax())
    lines = [ln for ln in ax.get_lines() if not ln.get_label().startswith("_")]
    arms = list(dict.fromkeys(f"{i} ({p})" for i, p in zip(ds["intervention"].values, ds["phase"].values)))
    assert [ln.get_label() for ln in lines] == arms and len(arms) == 6  # 30 runs = 6 arms x 5 seeds
    assert len({ln.get_color() for ln in lines}) == 6
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert len(labels) == len(set(labels)) == 7  # the arms and the band
    # the forest plot: a row per contrast, far and in-range means at the dataset's values
    ax = contrast_forest_panel(ds, _ax())
    arms = list(ds["contrast"].values.astype(str))
    assert [t.get_text() for t in ax.get_yticklabels()] == arms
    far, inside = ax.containers  # two errorbar containers, in legend order
    np.testing.assert_allclose(far.lines[0].get_xdata(), ds["far_contrast_mean"].isel(mixer=0).values)
    np.testing.assert_allclose(inside.lines[0].get_xdata(), ds["in_contrast_mean"].isel(mixer=0).values)
    segments = far.lines[2][0].get_segments()
    np.testing.assert_allclose([s[0][0] for s in segments], ds["far_contrast_lo"].isel(mixer=0).values)
    np.testing.assert_allclose([s[1][0] for s in segments], ds["far_contrast_hi"].isel(mixer=0).values)
    p = np.stack([ds["far_contrast_p"].isel(mixer=0).values, ds["in_contrast_p"].isel(mixer=0).values])
    adjusted = holm(p)
    assert (adjusted >= p).all()
    texts = [t.get_text() for t in ax.texts]
    assert texts == [("p < 0.001" if q < 0.001 else f"p = {q:.3f}") for q in adjusted.ravel()]
    assert "Holm-corrected" in ax.get_legend().get_title().get_text()
    assert "contrasts" in length_generalization_panels(ds)


def test_a_title_wider_than_its_axes_is_wrapped_to_fit():
    from dynlab.figures import Panel, composite_figure, needs, panel_figure
    from dynlab.figures.style import publication_style

    long = "a very long title " * 6 + "that would run far beyond the edges of its axes"

    @needs("x", what="long")
    def draw(ds, ax):
        ax.plot(ds["x"].values)
        ax.set_title(long)
        return ax

    ds = xr.Dataset({"x": ("i", np.arange(3.0))})
    with publication_style():
        fig = Figure(figsize=(3.4, 2.5))
        fig.add_subplot().set_title(long)
        assert _clipped_titles(fig)  # the check sees the clipped title
        fig, why = panel_figure(ds, Panel(draw))
        assert why is None and _clipped_titles(fig) == []
        assert fig.axes[0].get_title().replace("\n", " ") == " ".join(long.split())
        comp = composite_figure(ds, [("a", Panel(draw), None), ("b", Panel(draw), None), ("c", Panel(draw), None)])
        assert _clipped_titles(comp) == [] and comp.get_figwidth() == pytest.approx(7.2)
        assert comp.axes[0].get_title(loc="left").startswith("(a) a very long")


def test_task_panels_count_left_out_runs_correct_stars_and_label_bands():
    from dynlab.figures.arms import BAND
    from dynlab.lm.figures.panels import holm
    from dynlab.lm.figures.tasks import babi_panel, copying_panel, passkey_difference, passkey_heatmap

    ds = xr.open_dataset(DATASETS / "passkey.nc").load()
    post = ds["phase"].values.astype(str) == "post"  # the heatmaps draw the post-trained arms
    row = int(np.flatnonzero(post)[0])
    first = str(ds["intervention"].values[row])
    status = ds["status"].values.astype(object)
    status[row] = "not-learned"
    ds["status"] = ("run", status.astype(str))
    n = int(((ds["intervention"].values == first) & post & (ds["status"].values == "ok")).sum())
    title = passkey_heatmap(ds, _ax(), first).get_title()
    assert f"({n} learned runs, 1 not learned (left out);" in title
    # stars: cells whose p, Holm-adjusted over every cell of every contrast, is below 0.05
    c = str(ds["contrast"].values[0])
    ax = passkey_difference(ds, _ax(), c)
    every = ds["contrast_p"].isel(mixer=0)
    adjusted = every.copy(data=holm(every.values)).sel(contrast=c).values
    assert sum(t.get_text().endswith("*") for t in ax.texts) == int((adjusted < 0.05).sum())
    assert f"Holm-adjusted p < 0.05, {int(np.isfinite(every.values).sum())} tests" in ax.get_title()
    # the min-max band is named, last in the legend
    ax = copying_panel(xr.open_dataset(DATASETS / "copying.nc"), _ax())
    assert [t.get_text() for t in ax.get_legend().get_texts()][-1] == BAND
    babi = xr.open_dataset(DATASETS / "babilong.nc")
    failed = babi["status"].values.astype(str) != "ok"
    iv = str(babi["intervention"].values[failed][0])
    assert "1 not learned (left out)" in babi_panel(babi, _ax(), iv).get_title()


def test_effrem_on_a_log_axis_of_the_context_kept():
    from dynlab.lm.figures.panels import effrem_panel

    ds = xr.open_dataset(DATASETS / "length-generalization.nc")
    ax = effrem_panel(ds, _ax())
    assert ax.get_xscale() == "log" and ax.get_xlabel() == "context kept T − t [tokens]"
    line = next(ln for ln in ax.get_lines() if not ln.get_label().startswith("_"))
    runs = np.flatnonzero(ds["intervention"].values == ds["intervention"].values[0])
    pos = "t_effrem" if "t_effrem" in ds["effrem"].dims else "t"  # the committed dataset's layout
    mean = ds["effrem"].isel(run=runs).mean("run").dropna(pos)
    kept = int(ds["eval_length"].values[runs[0]]) - mean[pos].values
    order = np.argsort(kept)
    order = order[kept[order] >= 1]
    np.testing.assert_allclose(line.get_xdata(), kept[order])
    np.testing.assert_allclose(line.get_ydata(), mean.values[order])
    assert line.get_xdata().min() == 1  # EffRem of the last token alone is drawn
