"""The T_cross-vs-horizon panel's title: Pearson r of the log2 values when both sides vary,
and why r is undefined when one side has one value for every model (never "r = nan")."""

from __future__ import annotations

import matplotlib
import numpy as np
import xarray as xr

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from dynlab.lm.figures.tasks import geometry_tcross_panel  # noqa: E402


def _ds(t, h) -> xr.Dataset:
    n = len(t)
    return xr.Dataset({"geo_T_cross": ("run", np.asarray(t, float)), "geo_crossed": ("run", np.ones(n, bool)),
                       "geo_horizon": ("run", np.asarray(h, float)), "geo_horizon_reached": ("run", [True] * (n - 1) + [False]),
                       "intervention": ("run", ["zero"] * n), "status": ("run", ["ok"] * n)})


def _title(ds: xr.Dataset) -> str:
    return geometry_tcross_panel(ds, Figure().add_subplot()).get_title()


def test_title_gives_r_of_the_log2_values_and_the_censored_counts():
    t, h = [8, 16, 32, 64], [16, 16, 128, 256]
    want = np.corrcoef(np.log2(t), np.log2(h))[0, 1]
    assert _title(_ds(t, h)) == (f"T_cross vs retrieval horizon: r = {want:.2f}\n"
                                 "(n = 4; censored: 0 T_cross, 1 horizons)")


def test_title_says_why_r_is_undefined():
    assert "r undefined (T_cross is 8 in every model)" in _title(_ds([8, 8, 8], [64, 128, 256]))
    assert "r undefined (the horizon is 512 in every model)" in _title(_ds([8, 16, 32], [512, 512, 512]))
    assert "r undefined (2 models or fewer)" in _title(_ds([8, 16], [32, 64]))
    assert "nan" not in _title(_ds([8, 8, 8], [64, 128, 256]))
