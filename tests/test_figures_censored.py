"""The T_cross–mp panel with censored runs: drawn as censored, counted where they stack, and
Pearson r of the uncensored runs alone beside the study's r (checked against numpy)."""

from __future__ import annotations

import matplotlib
import numpy as np
import xarray as xr

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from dynlab.figures.tracking import tcross_mp_scatter, uncensored_pearson  # noqa: E402
from dynlab.results.schema import annotate  # noqa: E402

N_FREE, N_STACK, HORIZON = 12, 29, 1000.0


def _dataset() -> xr.Dataset:
    """12 runs with T_cross and mp both finite and loosely related, then 29 runs that
    never crossed (T_cross NaN, censored at the horizon 1000) and passed every length
    (mp = 1000, censored): the stack at (1000, 1000) that makes r over all runs near 1."""
    rng = np.random.default_rng(3)
    tc_free = rng.uniform(20, 400, N_FREE)
    mp_free = np.clip(tc_free * rng.uniform(0.3, 3.0, N_FREE), 5, 900)
    n = N_FREE + N_STACK
    tc = np.concatenate([tc_free, np.full(N_STACK, np.nan)])
    mp = np.concatenate([mp_free, np.full(N_STACK, HORIZON)])
    ds = xr.Dataset(
        {"T_cross": ("run", tc), "mp": ("run", mp), "mp_censored": ("run", np.arange(n) >= N_FREE),
         "horizon": ("run", np.full(n, HORIZON)), "status": ("run", np.array(["ok"] * n)),
         "corr_r": (("variant", "censoring"), [[0.99, 0.5]]), "corr_r_lo": (("variant", "censoring"), [[0.98, 0.1]]),
         "corr_r_hi": (("variant", "censoring"), [[0.995, 0.8]]), "corr_rho": (("variant", "censoring"), [[0.9, 0.5]]),
         "corr_rho_lo": (("variant", "censoring"), [[0.8, 0.1]]), "corr_rho_hi": (("variant", "censoring"), [[0.95, 0.8]]),
         "corr_n": (("variant", "censoring"), [[n, N_FREE]])},
        coords={"run": np.arange(n), "length": [10, 100, 1000], "family": ("run", np.array(["affine"] * n)),
                "variant": ["q"], "censoring": ["replace", "drop"]},
        attrs={"corr_default_variant": "q"})
    return annotate(ds), tc_free, mp_free


def _fisher_ci(r: float, n: int) -> tuple[float, float]:
    """The 95 % Fisher-z interval of a Pearson r, written out (not scipy)."""
    z, se = np.arctanh(r), 1.0 / np.sqrt(n - 3)
    return float(np.tanh(z - 1.959963984540054 * se)), float(np.tanh(z + 1.959963984540054 * se))


def test_uncensored_r_and_ci_match_numpy_and_fisher():
    _, tc, mp = _dataset()
    r = float(np.corrcoef(tc, mp)[0, 1])
    lo, hi = _fisher_ci(r, tc.size)
    assert uncensored_pearson(tc, mp) == f"r = {r:.2f} [{lo:.2f}, {hi:.2f}], n = {tc.size}"
    assert uncensored_pearson(tc[:2], mp[:2]).startswith("r undefined")
    assert uncensored_pearson(np.full(5, 3.0), np.arange(5.0)).startswith("r undefined")


def test_censored_stack_is_counted_and_both_rs_are_in_the_legend():
    ds, tc, mp = _dataset()
    ax = tcross_mp_scatter(ds, Figure(figsize=(3.4, 2.5)).add_subplot())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"censored (at its bound): {N_STACK}" in labels
    notes = [t.get_text() for t in ax.texts]
    assert f"×{N_STACK}" in notes  # the 29 runs on one point are said to be 29
    (stats,) = [n for n in notes if n.startswith("all, censored at bounds: r = 0.99")]
    assert stats.endswith("\nuncensored only: " + uncensored_pearson(tc, mp))
    assert len(notes) == 2
    open_points = [c for c in ax.collections if len(c.get_offsets()) and not np.asarray(c.get_facecolors()).size]
    assert sum(len(c.get_offsets()) for c in open_points) == N_STACK
    np.testing.assert_allclose(np.concatenate([c.get_offsets() for c in open_points]), [[HORIZON, HORIZON]] * N_STACK,
                               rtol=0, atol=1e-9)
