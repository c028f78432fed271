"""Figures a paper can print: every figure `dynlab figures` draws (each panel at column and
page width, each composite) has no legend or note on a data point, no text under 6 pt,
no title clipped, and fits a two-column page (7.2 × 9.5 in), measured with matplotlib's
own extents (tests/helpers/figure_checks.py); composites are split per claim and page;
the mp axis has no point under its '0'; the geometry panel's arms hide none another; and
the command's --panels, --format and --width."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import xarray as xr

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from dynlab.figures import MAX_ROWS, Panel, composite_figure, composite_pages, figure_items, panel_figure  # noqa: E402
from dynlab.tracking.figures.panels import tcross_mp_scatter  # noqa: E402
from dynlab.tracking.figures.sets import group_tracking_panels, nonlinearity_panels  # noqa: E402
from dynlab.figures.legends import fit_legends  # noqa: E402
from dynlab.figures.style import PAGE_HEIGHT, PAGE_WIDTH, publication_style  # noqa: E402
from dynlab.results.schema import write_dataset  # noqa: E402

from helpers.figure_checks import clipped_titles, covered_points, over_page, small_text  # noqa: E402
from helpers.figure_data import censored_dataset, forget_dataset, synthetic  # noqa: E402
from helpers.paths import REPO  # noqa: E402

DATASETS = REPO / "benchmarks" / "results" / "datasets"


def _problems(ds: xr.Dataset, items, widths=("column",), composites: bool = True) -> list[str]:
    """What keeps a figure of ``items`` from print, as `dynlab figures` draws them: each
    panel at each of ``widths``, then (``composites``) each composite page of the drawn panels."""
    found, drawn = [], []

    def check(name: str, fig) -> None:
        found.extend(f"{name}: {p}" for p in covered_points(fig))  # draws the figure, for the checks after it
        found.extend(f"{name}: {p} (under 6 pt)" for p in small_text(fig, draw=False))
        found.extend(f"{name}: title {t!r} clipped" for t in clipped_titles(fig, draw=False))
        if over_page(fig):
            found.append(f"{name}: {fig.get_size_inches()} in is larger than a page")

    with publication_style():
        for name, item in items.items():
            if not isinstance(item, Panel) or item.missing(ds):
                continue
            for width in widths:
                fig, why = panel_figure(ds, item, width)
                check(f"{name} ({width})", fig)
            drawn.append((name, item, why))
        for stem, page in composite_pages(str(ds.attrs.get("study", "study")), drawn) if composites else ():
            fig = composite_figure(ds, page)
            check(stem, fig)
            if len(page) > 1:
                assert fig.get_figwidth() == pytest.approx(PAGE_WIDTH), stem
    return found


def test_the_checks_see_a_legend_on_a_line_a_note_on_a_point_and_small_text():
    """The checks can fail: a legend on a chance line and on points, a note on a point, 5 pt
    text and a figure taller than a page are each found; once the legends are fitted, the
    legend covers nothing (the note is not moved: a panel places its notes itself)."""
    with publication_style():
        fig = Figure(figsize=(3.4, 2.5), layout="constrained")
        ax = fig.add_subplot()
        x = np.linspace(0, 1, 50)
        ax.plot(x, 0.5 + 0.4 * x, marker="o", label="a rising line")
        ax.axhline(0.85, color="0.5", linestyle=":", label="chance")
        ax.set_ylim(0, 1)
        ax.legend(loc="upper left")
        assert [p for p in covered_points(fig) if p.startswith("legend")]
        ax.text(0.5, 0.7, "r = 0.9", fontsize=5)
        problems = covered_points(fig)
        assert any(p.startswith("text 'r = 0.9'") for p in problems), problems
        assert small_text(fig) == ["'r = 0.9' at 5 pt"]
        assert not fit_legends(fig)  # moved to a free place inside: none left the axes
        assert [p for p in covered_points(fig) if p.startswith("legend")] == []
        for y in np.linspace(0.05, 0.95, 10):  # no place inside is free any more: moved below the axes
            ax.axhline(y, linewidth=0.5)
        assert fit_legends(fig)
        assert [p for p in covered_points(fig) if p.startswith("legend")] == []
        assert ax.get_legend().get_window_extent().y1 <= ax.get_window_extent().y0
    assert over_page(Figure(figsize=(7.0, 20.0))) and not over_page(Figure(figsize=(PAGE_WIDTH, PAGE_HEIGHT)))


def test_every_panel_of_the_small_group_tracking_study_prints():
    """Each panel of the synthetic group-tracking dataset at column width (the composites
    and the page width: the test after this one)."""
    ds = synthetic()
    items = figure_items(ds, group_tracking_panels)
    assert _problems(ds, items, composites=False) == []


@pytest.mark.slow
def test_every_figure_of_the_small_studies_prints():
    """The synthetic group-tracking and nonlinearity datasets (every panel of the studies, at
    column and page width, and their composites), the censored T_cross stack, the state
    preset's maps."""
    ds = synthetic()
    assert _problems(ds, figure_items(ds, group_tracking_panels), ("page",)) == []
    ablation = ds.assign_coords(nonlinearity=("run", np.array(["tanh", "sphere"] * 4)))
    ablation.attrs["study"] = "nonlinearity"
    assert _problems(ablation, figure_items(ablation, nonlinearity_panels)) == []
    censored, _, _ = censored_dataset()
    assert _problems(censored, {"tcross_mp": Panel(tcross_mp_scatter)}) == []
    from dynlab.lm.figures.forget import forget_horizon_panel, forget_map_panel

    state = forget_dataset()
    assert _problems(state, {"forget_map": Panel(forget_map_panel), "forget_horizon": Panel(forget_horizon_panel)}) == []


@pytest.mark.slow
@pytest.mark.parametrize("path", sorted(DATASETS.glob("*.nc")), ids=lambda p: p.stem)
def test_every_figure_of_each_committed_dataset_prints(path):
    """Every panel and composite of each committed dataset, as `dynlab figures` draws them:
    nothing raises, no legend or note covers a data point, nothing under 6 pt, no title
    clipped, nothing larger than a page."""
    from dynlab.studies import get_study

    ds = xr.open_dataset(path)
    assert _problems(ds, figure_items(ds, get_study(ds.attrs["study"]).panels)) == []


def test_composites_are_one_per_claim_and_a_page_each():
    """The main figure first and named after the study, one per claim after it, each split
    into pages of at most three rows of two; a composite of more is refused."""
    ds = synthetic()
    drawn = [(n, p, None) for n, p in group_tracking_panels(ds).items()]
    pages = composite_pages("group-tracking", drawn)
    assert [(stem, [n for n, *_ in page]) for stem, page in pages] == [
        ("group-tracking", ["q_curves", "q_dec_curves", "tcross_mp", "tcross_q_mp", "horizon_forecast", "r_par_perp"]),
        ("group-tracking-accuracy", ["accuracy_S3", "accuracy_C2"]),
        ("group-tracking-dynamics", ["return_map_eigs", "fixed_point_spectra", "perturbation_recovery",
                                     "failure_modes", "failure_modes_dec", "margin"])]
    many = [(f"p{i}", Panel(tcross_mp_scatter), None) for i in range(2 * MAX_ROWS + 3)]
    assert [(stem, len(page)) for stem, page in composite_pages("s", many)] == [("s", 6), ("s-2", 3)]
    with pytest.raises(ValueError, match="at most 6 panels"):
        composite_figure(ds, many)


def _mp_axis(ds: xr.Dataset):
    fig = Figure(figsize=(3.4, 2.5))
    ax = tcross_mp_scatter(ds, fig.add_subplot())
    fig.draw_without_rendering()
    lo = ax.get_ylim()[0]
    labels = {t.get_text(): t.get_position()[1] for t in ax.get_yticklabels() if t.get_position()[1] >= lo}
    ys = np.concatenate([c.get_offsets()[:, 1] for c in ax.collections])
    return labels, ys


def test_the_mp_axis_says_0_only_below_every_point():
    """An mp pooled over lengths may lie under the shortest length: it is drawn where it is,
    and no '0' is written above it; a run with mp = 0 is drawn at the '0', the lowest point."""
    ds = synthetic()
    mp = ds["mp"].values.copy()
    mp[3] = 2.0  # passed up to 2, under the shortest length 10; no run at 0
    ds["mp"] = ("run", mp)
    labels, ys = _mp_axis(ds)
    assert "0" not in labels and 2.0 in ys
    mp[6] = 0.0  # and one run failed at its first length
    ds["mp"] = ("run", mp)
    labels, ys = _mp_axis(ds)
    assert labels["0"] == pytest.approx(1.0) and ys.min() == pytest.approx(1.0)  # half the smallest mp, 2
    assert sorted(ys)[1] == pytest.approx(2.0)


def test_the_geometry_arms_are_drawn_side_by_side_and_counted():
    """Three arms at one (T_cross, horizon): their markers apart by more than a marker, at
    their values; two models of one arm on one point: '×2'."""
    from dynlab.lm.figures.tasks import geometry_tcross_panel

    t, h = [8.0, 8.0, 8.0, 8.0, 16.0], [512.0, 512.0, 512.0, 512.0, 64.0]
    ds = xr.Dataset({"geo_T_cross": ("run", t), "geo_crossed": ("run", [True] * 5), "geo_horizon": ("run", h),
                     "geo_horizon_reached": ("run", [True] * 5),
                     "intervention": ("run", ["zero", "zero", "fitted-noise", "state-passing", "zero"]),
                     "status": ("run", ["ok"] * 5)})
    fig = Figure(figsize=(3.4, 2.5))
    ax = geometry_tcross_panel(ds, fig.add_subplot())
    fig.draw_without_rendering()
    at = {c.get_label(): c.get_offset_transform().transform(c.get_offsets()) for c in ax.collections}
    np.testing.assert_allclose(np.concatenate([c.get_offsets() for c in ax.collections]),
                               [[8, 512], [8, 512], [16, 64], [8, 512], [8, 512]])  # the data, unchanged
    diameter = np.sqrt(ax.collections[0].get_sizes()[0]) * fig.dpi / 72
    stack = [at["zero"][0], at["fitted-noise"][0], at["state-passing"][0]]
    gaps = [np.hypot(*(a - b)) for i, a in enumerate(stack) for b in stack[i + 1:]]
    assert min(gaps) > diameter
    assert [t.get_text() for t in ax.texts] == ["×2"]
    fit_legends(fig)
    assert covered_points(fig) == []  # the count is on no marker either


def _bare(tmp_path):
    ds = synthetic()
    bare = ds[["accuracy", "mp", "status"]].isel(run=[4, 5, 6, 7])  # C2 only, no analyses: fast
    bare.attrs = dict(ds.attrs)
    write_dataset(bare, tmp_path / "study" / "dataset.nc")
    return tmp_path / "study"


def test_figures_command_draws_the_panels_asked_for_in_the_formats_and_width_asked_for(tmp_path, capsys):
    """--panels draws those panels only (no composite), --format writes each format,
    --width page draws them 7.2 in wide."""
    from dynlab.cli import main

    study, out = _bare(tmp_path), tmp_path / "figs"
    assert main(["figures", str(study), "--out", str(out), "--panels", "accuracy_C2", "--format", "svg,pdf",
                 "--width", "page"]) == 0
    written = capsys.readouterr().out.splitlines()
    assert written == [str(out / "accuracy_C2.svg"), str(out / "accuracy_C2.pdf")]
    assert sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) == [
        "NOTES.txt", "accuracy_C2.pdf", "accuracy_C2.svg"]
    assert 'width="518.4pt"' in (out / "accuracy_C2.svg").read_text()[:2000]  # 7.2 in
    assert main(["figures", str(study), "--out", str(out)]) == 0  # every panel and the composite, PNG and PDF
    names = {p.name for p in out.iterdir()}
    assert {"accuracy_C2.png", "accuracy_C2.pdf", "group-tracking-accuracy.png", "group-tracking-accuracy.pdf"} <= names


@pytest.mark.parametrize("option, value, line", [
    ("--panels", "accuracy_C2,nope", "error: unknown --panels 'nope' for this group-tracking dataset; "
                                     "allowed: a comma list of accuracy_C2, q_curves, "),
    ("--format", "png,tiff", "error: unknown --format 'tiff'; allowed: a comma list of png, pdf, svg"),
    ("--width", "wide", "error: unknown --width 'wide'; allowed: column, page (3.4 in, one column; 7.2 in, the page)"),
    ("--panels", "accuracy_C2,", "error: --panels 'accuracy_C2,' has an empty item; "),
])
def test_figures_command_refuses_an_unknown_panel_format_or_width_in_one_line(tmp_path, capsys, option, value, line):
    from dynlab.cli import main

    study, out = _bare(tmp_path), tmp_path / "figs"
    assert main(["figures", str(study), "--out", str(out), option, value]) == 2
    err = capsys.readouterr().err
    assert err.startswith(line) and err.count("\n") == 1, err
    assert not out.exists()  # nothing written


@pytest.mark.slow
def test_the_groups_dataset_draws_its_claim_one_accuracy_heatmap_per_group():
    """The groups preset's claim is its accuracy heatmaps: the committed dataset holds the
    accuracy of every run at every test length, and `dynlab figures` draws one heatmap per
    group whose cells are the mean over each architecture's learned seeds."""
    from dynlab.tracking.figures.panels import accuracy_heatmap
    from dynlab.results.schema import open_dataset

    ds = open_dataset(DATASETS / "group-tracking-groups.nc")
    learned = ds["status"] == "ok"
    assert np.isfinite(ds["accuracy"].where(learned, drop=True)).all()
    names = [n for n in figure_items(ds, group_tracking_panels) if n.startswith("accuracy_")]
    groups = sorted(set(ds["group"].values.tolist()))
    assert sorted(n.removeprefix("accuracy_") for n in names) == groups
    g = groups[0]
    ax = Figure().add_subplot()
    accuracy_heatmap(ds, ax, group=g)
    image = np.ma.filled(ax.get_images()[0].get_array(), np.nan)
    sub = ds.where((ds["group"] == g) & learned, drop=True)
    for arch in sorted(set(sub["arch"].values.tolist())):
        row = [t.get_text().split(" (")[0] for t in ax.get_yticklabels()].index(arch)
        want = sub["accuracy"].where(sub["arch"] == arch, drop=True).mean("run").values
        np.testing.assert_allclose(image[row], want, rtol=1e-6)
