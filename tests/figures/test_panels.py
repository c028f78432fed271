"""Figure panels on a synthetic study dataset whose drawn values are known analytically."""

from __future__ import annotations

import matplotlib
import numpy as np
import pytest
import xarray as xr

matplotlib.use("Agg")
from matplotlib.collections import PathCollection  # noqa: E402
from matplotlib.figure import Figure  # noqa: E402
from matplotlib.patches import Circle  # noqa: E402

from dynlab.figures import MissingData, write_figures  # noqa: E402
from dynlab.tracking.figures.ablation import default_mode_variable, mp_by_nonlinearity, mp_failure_table  # noqa: E402
from dynlab.tracking.figures.dynamics import (  # noqa: E402
    failure_modes, fixed_point_spectra, margin_panel, perturbation_recovery, return_map_eigs,
)
from dynlab.tracking.figures.panels import accuracy_heatmap, q_curves, r_par_perp, tcross_mp_scatter  # noqa: E402
from dynlab.tracking.figures.sets import group_tracking_panels  # noqa: E402
from dynlab.results.schema import write_dataset  # noqa: E402

from helpers import figure_data  # noqa: E402

ARCHS, GROUPS, SEEDS, T = figure_data.ARCHS, figure_data.GROUPS, figure_data.SEEDS, figure_data.T
synthetic = figure_data.synthetic


def _ax():
    return Figure(figsize=(3.4, 2.5)).add_subplot()


def test_accuracy_heatmap_shows_seed_mean_per_arch_affine_first():
    ds = synthetic()
    ax = accuracy_heatmap(ds, _ax(), group="C2")
    img = ax.get_images()[0].get_array()
    np.testing.assert_allclose(np.asarray(img), [[0.35] * 4, [0.85] * 4])
    assert [t.get_text() for t in ax.get_yticklabels()] == ["mamba", "tanh-rnn"]
    assert [t.get_text() for t in ax.get_xticklabels()] == ["10", "60", "200", "1000"]
    assert ax.get_xlabel() == "sequence length [tokens]" and "C2" in ax.get_title()


def test_accuracy_heatmap_marks_rows_that_did_not_learn():
    from matplotlib.patches import Rectangle

    ds = synthetic()
    group, arch, seed = ds["group"].values.astype(str), ds["arch"].values.astype(str), ds["seed"].values
    status = np.where((group == "C2") & (arch == "mamba"), "not-learned", "ok")
    status = np.where((group == "C2") & (arch == "tanh-rnn") & (seed == seed.max()), "not-learned", status)
    ds["status"] = ("run", status)
    ax = accuracy_heatmap(ds, _ax(), group="C2")
    assert [t.get_text() for t in ax.get_yticklabels()] == ["mamba (0/2)", "tanh-rnn (1/2)"]
    img = np.ma.filled(np.asarray(ax.get_images()[0].get_array(), dtype=float), np.nan)
    assert np.isnan(img[0]).all()  # no learned mamba seed: no colour, a hatched row
    expected = ds["accuracy"].values[(group == "C2") & (status == "ok")].mean(axis=0)
    np.testing.assert_allclose(img[1], expected)  # the learned seed only
    hatched = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch()]
    assert len(hatched) == 1 and hatched[0].get_y() == pytest.approx(-0.5)
    assert "not learned (2 seeds)" in [t.get_text() for t in ax.texts]


def test_q_curves_mark_tau_and_tcross():
    ds = synthetic()
    ax = q_curves(ds, _ax(), group="S3")
    curves = [ln for ln in ax.get_lines() if ln.get_linestyle() == "-" and len(ln.get_xdata()) == T]
    assert len(curves) == 4
    marks = sorted((float(ln.get_xdata()[0]), float(ln.get_ydata()[0]))
                   for ln in ax.get_lines() if ln.get_marker() == "x" and len(ln.get_xdata()))
    assert marks == [(10.0, 0.5), (20.0, 0.5), (30.0, 0.5), (40.0, 0.5)]  # S3 = runs 0..3, q(T_cross) = τ
    tau_lines = [ln for ln in ax.get_lines() if ln.get_linestyle() == "--"]
    assert tau_lines and float(tau_lines[0].get_ydata()[0]) == 0.5
    assert ax.get_ylabel() == "distinguishability ratio q = R/M" and ax.get_xscale() == "log"
    assert ax.xaxis.get_minor_formatter()(3.0) == ""  # no crowded minor labels


def test_tcross_mp_scatter_places_censored_runs_at_their_bound_and_prints_r():
    ds = synthetic()
    ax = tcross_mp_scatter(ds, _ax())
    pts = np.concatenate([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])
    tc = np.where(np.isfinite(ds["T_cross"].values), ds["T_cross"].values, T)
    mp = np.where(ds["mp"].values > 0, ds["mp"].values, 5.0)
    expected = sorted(zip(tc.tolist(), mp.tolist()))
    assert sorted(map(tuple, pts.tolist())) == expected
    stats = ax.get_legend().get_title().get_text()  # the r of all runs and of the uncensored ones head the legend
    assert "r = 0.87 [0.80, 0.92]" in stats and "ρ = 0.81" in stats and "n = 8" in stats, stats
    assert ax.get_xlabel() == "first persistent crossing step [step]"


def test_horizon_forecast_scatter_fills_failing_runs_and_prints_their_loglog_r():
    from dynlab.tracking.figures.panels import horizon_forecast_scatter

    ds = synthetic()
    # mp = [1000c, 200, 60, 0, 1000c, 1000c, 10, 60]; the failing runs with a forecast are 1, 2, 6, 7
    pred = np.array([800.0, 150.0, 90.0, np.nan, np.nan, 700.0, 12.0, 45.0])
    ds["T_horizon"] = ("run", pred, {"long_name": "horizon forecast", "units": "step"})
    ax = horizon_forecast_scatter(ds, _ax())
    cols = [c for c in ax.collections if isinstance(c, PathCollection)]
    pts = sorted(map(tuple, np.concatenate([c.get_offsets() for c in cols]).tolist()))
    assert pts == sorted([(800.0, 1000.0), (150.0, 200.0), (90.0, 60.0), (50.0, 5.0), (50.0, 1000.0),
                          (700.0, 1000.0), (12.0, 10.0), (45.0, 60.0)])
    filled = sorted(map(tuple, np.concatenate([c.get_offsets() for c in cols if c.get_facecolors().size
                                               and c.get_facecolors()[0, 3] > 0]).tolist()))
    assert filled == [(12.0, 10.0), (45.0, 60.0), (90.0, 60.0), (150.0, 200.0)]
    x, y = np.log([150.0, 90.0, 12.0, 45.0]), np.log([200.0, 60.0, 10.0, 60.0])
    r = np.corrcoef(x, y)[0, 1]
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    # ranks of mp with the tie 60, 60 at 2.5: ρ = corr([4, 3, 1, 2], [4, 2.5, 1, 2.5])
    rho = np.corrcoef([4, 3, 1, 2], [4, 2.5, 1, 2.5])[0, 1]
    assert any(f"r = {r:.2f}, ρ = {rho:.2f}, n = 4" in t for t in texts), texts
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    assert ax.get_xlabel() == "horizon forecast [step]"


def test_r_par_perp_draws_family_medians_over_M():
    ds = synthetic()
    ax = r_par_perp(ds, _ax(), group="C2")
    c = np.linspace(0.001, 0.004, 8)
    t = np.arange(1, T + 1)
    # C2 runs are 4..7: affine = runs 4, 5; the median of two is their mean.
    med_par_affine = (c[4] + c[5]) / 2 * t
    lines = {(ln.get_color(), ln.get_linestyle()): ln.get_ydata() for ln in ax.get_lines() if len(ln.get_xdata()) == T}
    np.testing.assert_allclose(lines[("#1f5fa8", "-")], med_par_affine)
    np.testing.assert_allclose(lines[("#1f5fa8", "--")], 2 * med_par_affine)


def test_return_map_eigs_on_the_complex_plane_with_unit_circle():
    ds = synthetic()
    ax = return_map_eigs(ds, _ax())
    circles = [p for p in ax.patches if isinstance(p, Circle)]
    assert len(circles) == 1 and circles[0].get_radius() == 1.0
    radii = {c.get_label(): np.hypot(*c.get_offsets().T) for c in ax.collections if isinstance(c, PathCollection)}
    np.testing.assert_allclose(radii["affine"], 1.0)
    np.testing.assert_allclose(radii["state-dependent"], 0.5)
    assert ax.get_aspect() == 1.0


def test_return_map_eigs_mark_non_learners_and_clip_far_eigenvalues():
    ds = synthetic()
    status = ds["status"].values.astype("<U16")
    status[[1, 3]] = "not-learned"  # run 1: affine (radius 1), run 3: state-dependent (radius 0.5)
    ds["status"] = ("run", status)
    re = ds["return_map_eig_real"].values.copy()
    re[2, 0] = 20.0  # one eigenvalue of an ok run far outside the unit circle
    ds["return_map_eig_real"] = (("run", "k"), re)
    ax = return_map_eigs(ds, _ax())
    pts = {c.get_label(): c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)}
    assert len(pts["not learned"]) == 2 * 3  # both non-learners' eigenvalues, as grey crosses
    np.testing.assert_allclose(sorted(np.hypot(*pts["not learned"].T)), [0.5] * 3 + [1.0] * 3)
    assert len(pts["affine"]) + len(pts["state-dependent"]) == 6 * 3 - 1  # the far one is not drawn
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "1 with |Re|, |Im| > 1.6 not shown" in texts
    assert ax.get_xlim() == (-1.6, 1.6)


def test_fixed_point_spectra_per_architecture_on_the_unit_circle():
    ds = synthetic()
    ax = fixed_point_spectra(ds, _ax())
    circles = [p for p in ax.patches if isinstance(p, Circle)]
    assert len(circles) == 1 and circles[0].get_radius() == 1.0
    pts = {c.get_label(): c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)}
    fam = dict(zip(ds["arch"].values, ds["family"].values))
    assert set(pts) == set(fam)
    for arch, xy in pts.items():
        n_runs = int((ds["arch"] == arch).sum()) - (1 if arch == str(ds["arch"].values[-1]) else 0)
        assert len(xy) == n_runs * 2 * 2  # 2 states × 2 eigenvalues per run
        np.testing.assert_allclose(np.hypot(*xy.T), 1.0 if fam[arch] == "affine" else 0.3)
    texts = [t.get_text() for t in ax.get_legend().get_texts()]
    assert "1 learned runs without a fixed point" in texts


def test_tcross_mp_scatter_of_another_variant_reads_its_row():
    ds = synthetic()
    ax = tcross_mp_scatter(ds, _ax(), variant="q_dec")
    stats = ax.get_legend().get_title().get_text()
    assert "r = 0.67 [0.60, 0.72]" in stats, stats
    pts = np.concatenate([c.get_offsets() for c in ax.collections if isinstance(c, PathCollection)])
    tc = np.where(np.isfinite(ds["T_cross_dec"].values), ds["T_cross_dec"].values, T)
    assert sorted(pts[:, 0].tolist()) == sorted(tc.tolist())


def test_perturbation_recovery_relative_size_decays_at_the_injected_rate():
    ds = synthetic()
    ax = perturbation_recovery(ds, _ax())
    s = np.arange(0, 11)
    got = {(ln.get_color(), ln.get_linestyle()): ln.get_ydata() for ln in ax.get_lines() if len(ln.get_xdata()) == 11}
    np.testing.assert_allclose(got[("#c8412b", "-")], np.exp(-0.2 * s))
    np.testing.assert_allclose(got[("#c8412b", "--")], np.exp(-0.4 * s))
    np.testing.assert_allclose(got[("#1f5fa8", "-")], 1.0)
    assert "t0 = 60" in ax.get_xlabel()


def test_failure_mode_counts_per_architecture():
    ds = synthetic()
    ax = failure_modes(ds, _ax())
    got = {(c.get_label(), arch): p.get_width()
           for c in ax.containers for p, arch in zip(c.patches, ["mamba", "tanh-rnn"])}
    # climb = runs 0..4 (T_cross ≤ 50), robust = runs 5..7; mamba = runs 0, 1, 4, 5
    assert got == {("robust", "mamba"): 1, ("robust", "tanh-rnn"): 2, ("climb", "mamba"): 3, ("climb", "tanh-rnn"): 2}
    assert [t.get_text() for t in ax.get_yticklabels()] == ["mamba", "tanh-rnn"]


def test_margin_panel_orders_groups_by_order_and_joins_medians():
    ds = synthetic()
    ax = margin_panel(ds, _ax())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["C2\n|G|=2", "S3\n|G|=6"]
    meds = [ln.get_ydata() for ln in ax.get_lines()]
    for m in meds:
        np.testing.assert_allclose(m, [1.01, 0.51])


def test_nonlinearity_panel_and_table():
    ds = synthetic()
    phis = np.array(["tanh", "sphere"] * 4)
    ds = ds.assign_coords(nonlinearity=("run", phis))
    ax = mp_by_nonlinearity(ds, _ax())
    assert [t.get_text() for t in ax.get_xticklabels()] == ["tanh", "sphere"]
    table = mp_failure_table(ds)
    lines = table.strip().splitlines()
    assert len(lines) == 2 + 4
    # tanh on S3 = runs 0 and 2: mp 1000 (censored) and 60 -> median 530, range 60–1000
    assert "| tanh | S3 | 2 | 2 | 530 | 60–1000 |" in table


def test_table_counts_the_default_variants_failure_modes():
    ds = synthetic().assign_coords(nonlinearity=("run", np.array(["tanh", "sphere"] * 4)))
    for variant, var in (("q", "failure_mode"), ("q_dec", "failure_mode_dec")):
        ds.attrs["corr_default_variant"] = variant
        assert default_mode_variable(ds) == var
        rows = [ln for ln in mp_failure_table(ds).splitlines()[2:]]
        for ln in rows:
            cells = [c.strip() for c in ln.strip("|").split("|")]
            sel = (ds.nonlinearity.values == cells[0]) & (ds.group.values == cells[1]) & (ds.status.values == "ok")
            want = [int(np.sum(sel & (ds[var].values == m))) for m in ("robust", "climb", "saturation")]
            assert [int(c) for c in cells[6:9]] == want, (variant, ln)


def test_missing_variables_raise_one_line():
    ds = synthetic().drop_vars(["q", "T_cross"])
    with pytest.raises(MissingData, match="q\\(t\\) curves needs q"):
        q_curves(ds, _ax())
    with pytest.raises(MissingData, match="group 'A5' not in the dataset"):
        accuracy_heatmap(synthetic(), _ax(), group="A5")


@pytest.mark.slow
def test_write_figures_png_pdf_composite_and_notes(tmp_path):
    ds = synthetic()
    figs = write_figures(ds, tmp_path / "all", group_tracking_panels)
    names = {p.name for p in figs.written}
    for stem in ("accuracy_S3", "accuracy_C2", "q_curves", "q_dec_curves", "tcross_mp", "tcross_q_mp",
                 "horizon_forecast", "r_par_perp", "return_map_eigs", "fixed_point_spectra",
                 "perturbation_recovery", "failure_modes", "failure_modes_dec", "margin", "group-tracking",
                 "group-tracking-accuracy", "group-tracking-dynamics"):  # a composite per claim
        assert {f"{stem}.png", f"{stem}.pdf"} <= names
        assert (tmp_path / "all" / f"{stem}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert (tmp_path / "all" / f"{stem}.pdf").read_bytes()[:5] == b"%PDF-"
    assert figs.skipped == {}
    bare = ds[["accuracy", "mp", "mp_censored", "status"]]
    bare.attrs = dict(ds.attrs)
    figs = write_figures(bare, tmp_path / "bare", group_tracking_panels)
    assert {p.name for p in figs.written} == {f"{s}.{e}" for s in ("accuracy_S3", "accuracy_C2", "group-tracking-accuracy")
                                              for e in ("png", "pdf")}
    assert set(figs.skipped) == {"q_curves", "q_dec_curves", "tcross_mp", "tcross_q_mp", "horizon_forecast", "r_par_perp",
                                 "return_map_eigs", "fixed_point_spectra", "perturbation_recovery", "failure_modes",
                                 "failure_modes_dec", "margin"}
    assert "q_curves: skipped (q(t) curves needs q, t" in (tmp_path / "bare" / "NOTES.txt").read_text()


@pytest.mark.slow
def test_cli_figures_command(tmp_path, capsys):
    from dynlab.cli import main

    ds = synthetic()
    bare = ds[["accuracy", "mp", "status"]].isel(run=[4, 5, 6, 7])  # C2 only, no analyses: fast
    bare.attrs = dict(ds.attrs)
    write_dataset(bare, tmp_path / "study" / "dataset.nc")
    assert main(["figures", str(tmp_path / "study"), "--out", str(tmp_path / "figs")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert str(tmp_path / "figs" / "group-tracking-accuracy.pdf") in out and str(tmp_path / "figs" / "accuracy_C2.png") in out
    assert "skipped q_curves: q(t) curves needs q, t (absent from the dataset)" in out
    assert main(["figures", str(tmp_path / "study"), "--out", str(tmp_path / "figs")]) == 0  # again: its own files
    assert main(["figures", str(tmp_path / "nowhere"), "--out", str(tmp_path / "f2")]) == 2


def test_figure_modules_import_no_torch():
    """The panels' own imports: matplotlib/numpy/xarray and torch-free dynlab modules only.

    (Checked on the source: ``import dynlab`` itself may pull torch in through the package's
    convenience exports, which is outside the figures' control.)"""
    import ast
    from pathlib import Path

    import dynlab.figures

    root = Path(dynlab.figures.__file__).parent
    allowed_dynlab = {"dynlab.figures", "dynlab.figures.panel", "dynlab.figures.style", "dynlab.tracking.figures.panels",
                      "dynlab.tracking.figures.runs", "dynlab.figures.arms", "dynlab.tracking.figures.dynamics", "dynlab.tracking.figures.ablation",
                      "dynlab.lm.figures.panels", "dynlab.figures.training", "dynlab.lm.figures.forget", "dynlab.figures.legends",
                      "dynlab.tracking.groups",
                      "dynlab.names",
                      "dynlab.analysis.contrasts",  # torch-free: numpy, xarray, scipy (Holm)
                      "dynlab.lm.report.forget", "dynlab.lm.report.tables"}  # torch-free: the state map's rule (numpy, scipy)
    for path in sorted(root.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            for name in names:
                assert name.split(".")[0] != "torch", (path.name, name)
                if name.startswith("dynlab"):
                    assert name in allowed_dynlab, (path.name, name)


def test_panels_declare_what_they_read():
    from dynlab.figures.panel import Panel, required_variables

    ds = synthetic()
    assert required_variables(q_curves, ds) == ["q", "t"]
    assert required_variables(q_curves, ds, None, variable="q_dec") == ["q_dec", "t"]
    assert required_variables(accuracy_heatmap, ds, None, by="nonlinearity") == ["accuracy", "nonlinearity", "length"]
    # the default T_cross variant comes from the dataset
    assert required_variables(tcross_mp_scatter, ds) == ["T_cross", "mp"]
    ds.attrs["corr_default_variant"] = "q_dec"
    assert required_variables(tcross_mp_scatter, ds) == ["T_cross_dec", "mp"]
    assert Panel(failure_modes, {"variable": "failure_mode_dec"}).missing(ds.drop_vars("failure_mode_dec")) == [
        "failure_mode_dec"]
    with pytest.raises(TypeError, match="declares no variables"):
        Panel(lambda ds, ax: ax)


@pytest.mark.slow
def test_driver_skips_only_declared_absences_and_lets_bugs_through(tmp_path):
    from dynlab.figures import NothingToDraw, Panel, Table, needs

    @needs("q", what="buggy panel")
    def buggy(ds, ax):
        return ds["not_declared"]  # a KeyError inside a panel is a bug, not a skip

    @needs("q", what="empty panel")
    def empty(ds, ax):
        raise NothingToDraw("empty panel has no finished runs to draw")

    @needs("no_such_variable", what="absent panel")
    def absent(ds, ax):
        raise AssertionError("not drawn: its variable is absent")

    @needs("q", what="empty table")
    def empty_table(ds):
        raise NothingToDraw("empty table has no finished runs to count")

    ds = synthetic()
    figs = write_figures(ds, tmp_path / "a", {"absent": Panel(absent), "empty": Panel(empty),
                                              "q_curves": Panel(q_curves), "counts": Table(empty_table)})
    assert figs.skipped == {"absent": "absent panel needs no_such_variable (absent from the dataset)",
                            "empty": "empty panel has no finished runs to draw",
                            "counts": "empty table has no finished runs to count"}
    # nothing to draw: still written, saying why (stable file names); an absent variable: no file
    assert figs.empty == ["empty", "counts"]
    assert {p.name for p in figs.written} == {"empty.png", "empty.pdf", "q_curves.png", "q_curves.pdf", "counts.md",
                                              "group-tracking.png", "group-tracking.pdf"}
    assert (tmp_path / "a" / "counts.md").read_text() == (
        "_empty table: nothing to tabulate (empty table has no finished runs to count)_\n")
    assert (tmp_path / "a" / "NOTES.txt").read_text().splitlines() == [
        "absent: skipped (absent panel needs no_such_variable (absent from the dataset))",
        "empty: drawn empty (empty panel has no finished runs to draw)",
        "counts: drawn empty (empty table has no finished runs to count)"]
    with pytest.raises(KeyError, match="not_declared"):
        write_figures(ds, tmp_path / "b", {"buggy": Panel(buggy)})


def test_an_empty_panel_says_why_in_its_middle_under_the_panels_label():
    from dynlab.figures import Panel, draw_empty

    panel = Panel(accuracy_heatmap, {"group": "C2", "by": "nonlinearity"})
    assert panel.label == "accuracy heatmap (group=C2, by=nonlinearity)"
    assert Panel(q_curves).label == "q(t) curves"
    ax = draw_empty(_ax(), panel.label, "accuracy heatmap has no finished runs to draw")
    assert ax.get_title() == "accuracy heatmap (group=C2, by=nonlinearity)"
    (text,) = ax.texts
    lines = text.get_text().splitlines()  # wrapped to fit a column-wide panel
    assert lines[0] == "nothing to draw:" and " ".join(lines[1:]) == "accuracy heatmap has no finished runs to draw"
    assert max(len(line) for line in lines) <= 44
    assert text.get_position() == (0.5, 0.5) and text.get_transform() == ax.transAxes
    assert list(ax.get_xticks()) == [] and list(ax.get_yticks()) == [] and not ax.lines and not ax.collections


@pytest.mark.slow
def test_a_study_where_no_run_learned_still_writes_every_panel(tmp_path, capsys):
    """Every run not-learned: the panels that draw learned runs only are written empty,
    saying why; the return-map panel (which marks not-learned runs) is drawn from data;
    the file set is the same as for a study whose runs learned."""
    from dynlab.cli import main

    ds = synthetic()
    ds["status"] = ("run", np.array(["not-learned"] * ds.sizes["run"]))
    names = set(group_tracking_panels(ds))
    figs = write_figures(ds, tmp_path / "none", group_tracking_panels)
    composites = {"group-tracking", "group-tracking-accuracy", "group-tracking-dynamics"}
    assert {p.name for p in figs.written} == {f"{n}.{e}" for n in names | composites for e in ("png", "pdf")}
    assert set(figs.empty) == set(figs.skipped) == names - {"return_map_eigs"}
    assert figs.skipped["accuracy_C2"] == "accuracy heatmap has no finished runs to draw"
    for p in figs.written:
        head = p.read_bytes()[:8]
        assert head == b"\x89PNG\r\n\x1a\n" if p.suffix == ".png" else head[:5] == b"%PDF-"
    notes = (tmp_path / "none" / "NOTES.txt").read_text().splitlines()
    assert sorted(notes) == sorted(f"{n}: drawn empty ({figs.skipped[n]})" for n in figs.empty)
    # the command line prints the note for each empty panel, next to the files
    write_dataset(ds, tmp_path / "study" / "dataset.nc")
    assert main(["figures", str(tmp_path / "study"), "--out", str(tmp_path / "figs")]) == 0
    out = capsys.readouterr().out.splitlines()
    assert str(tmp_path / "figs" / "q_curves.pdf") in out
    assert "drawn empty q_curves: q(t) curves has no finished runs to draw" in out


def test_inner_legends_and_texts_leave_the_layout_and_a_wide_one_no_longer_collapses_it():
    """A legend wider than its narrow axes collapsed a constrained layout (the warning the
    tests make an error); left out of the layout (inner_text_out_of_layout) it does not,
    while a legend anchored below its axes and a text outside it keep their place."""
    import warnings

    from dynlab.figures.style import fit_titles, inner_text_out_of_layout

    def crowded():
        fig = Figure(figsize=(3.0, 2.0), layout="constrained")
        axes = fig.subplots(1, 3).ravel()
        for ax in axes:
            ax.plot([0, 1], [0, 1], label="a very long legend entry that is wider than this narrow axes by far")
            ax.legend(loc="upper left")
        axes[0].text(0.98, 0.02, "a statistics line far wider than its axes: r = 0.99", transform=axes[0].transAxes)
        return fig, axes

    fig, _ = crowded()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with pytest.raises(UserWarning, match="collapsed"):
            fig.draw_without_rendering()
    fig, axes = crowded()
    below = axes[1].legend(loc="upper center", bbox_to_anchor=(0.5, -0.3))
    outside = axes[2].text(1.2, 0.5, "outside", transform=axes[2].transAxes)
    inner_text_out_of_layout(fig)
    assert not axes[0].get_legend().get_in_layout() and not axes[0].texts[0].get_in_layout()
    assert below.get_in_layout() and outside.get_in_layout()
    below.remove()
    outside.remove()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        fit_titles(crowded()[0])  # calls inner_text_out_of_layout first: lays out without the warning
