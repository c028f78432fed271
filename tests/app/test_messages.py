"""Help texts, listings and labels say what they should: every preset in --preset help,
aligned `study list` columns, option names in errors, labelled index coordinates, axis
labels without repeats, and README's plotting example draws curves."""

from __future__ import annotations

import re

import matplotlib
import numpy as np
import pytest
import xarray as xr

from dynlab.cli import main
from dynlab.studies import CATALOG, STUDIES

matplotlib.use("Agg")


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_preset_help_names_every_preset_of_the_study(name, capsys):
    assert main(["study", name, "--help"]) == 0
    text = re.sub(r"[\s│]+", " ", capsys.readouterr().out)  # rich wraps the help in a box
    help_text = text[text.index("--preset") :]
    for preset in STUDIES[name].presets:
        assert re.search(rf"\b{preset}\b", help_text), (name, preset)


def test_study_list_columns_line_up(capsys):
    assert main(["study", "list"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header, rows = lines[0], lines[1:]
    assert header.split() == ["study", "presets", "description"]
    col_presets, col_desc = header.index("presets"), header.index("description")
    assert len(rows) == len(STUDIES)
    for line, study in zip(rows, STUDIES.values()):
        assert line.startswith(study.name) and line.index(", ".join(study.presets)) == col_presets, line
        assert line[col_desc:] == CATALOG[study.name].description, line


@pytest.mark.parametrize("option", ["--models", "--groups", "--seeds"])
def test_an_empty_list_names_its_option(option, tmp_path, capsys):
    argv = ["study", "group-tracking", option, ",", "--out", str(tmp_path / "out"), "-q"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: {option} got an empty list (','); allowed: a comma list of one or more values"
    assert not (tmp_path / "out").exists()


def test_figures_out_that_is_a_file_is_one_clear_line(tmp_path, capsys):
    target = tmp_path / "figs.png"
    target.write_text("keep me")
    assert main(["figures", str(tmp_path / "no-study"), "--out", str(target)]) == 2
    err = capsys.readouterr().err.strip()
    assert err == f"error: --out {target} is a file; allowed: a folder (made when missing)"
    assert "Errno" not in err and target.read_text() == "keep me"


def test_index_coordinates_carry_long_name_and_units():
    from dynlab.results.schema import annotate

    ds = xr.Dataset(
        {"return_map_eig_real": (("run", "k"), np.zeros((2, 3))), "lyapunov": (("run", "k_lyap"), np.zeros((2, 4)))},
        coords={"run": np.arange(2), "k": np.arange(3), "k_lyap": np.arange(4)},
    )
    annotate(ds)
    for name in ("run", "k", "k_lyap"):
        assert ds[name].attrs["long_name"] and "units" in ds[name].attrs, name


def test_time_axis_labels_do_not_repeat_the_unit():
    from dynlab.analysis.geometry import geometry_over_time
    from dynlab.figures.style import axis_label

    rng = np.random.default_rng(0)
    states, labels = rng.normal(size=(24, 5, 3)), rng.integers(0, 2, size=(24, 5))
    t = geometry_over_time(states, labels, n_classes=2).t
    assert axis_label(t, "step") == "position t [tokens]"
    assert axis_label(xr.DataArray(0, attrs={"long_name": "step", "units": "step"})) == "step"
    assert axis_label(xr.DataArray(0, attrs={"long_name": "accuracy", "units": "1"})) == "accuracy"
    assert axis_label(xr.DataArray(0, attrs={"long_name": "training steps", "units": "steps"})) == "training steps [steps]"


def test_readme_accuracy_example_draws_one_curve_per_run(repo_root):
    """README: ds.accuracy.sel(run=ds.group == "S3").plot.line(x="length", hue="run")."""
    import matplotlib.pyplot as plt

    ds = xr.Dataset(
        {"accuracy": (("run", "length"), np.linspace(1, 0.5, 12).reshape(3, 4))},
        coords={"run": np.arange(3), "length": [10, 20, 40, 60], "group": ("run", ["S3", "C2", "S3"])},
    )
    readme = (repo_root / "README.md").read_text(encoding="utf-8")
    line = next(x for x in readme.splitlines() if "ds.accuracy.sel(" in x)
    expr = line.split("#")[0].strip()
    assert expr == 'ds.accuracy.sel(run=ds.group == "S3").plot.line(x="length", hue="run")'
    lines = eval(expr, {"ds": ds})
    assert len(lines) == 2 and all(len(ln.get_xdata()) == 4 for ln in lines)
    np.testing.assert_array_equal(lines[0].get_xdata(), [10, 20, 40, 60])
    plt.close("all")
