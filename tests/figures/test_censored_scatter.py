"""The T_cross–mp panel with censored runs: drawn as censored, counted where they stack, and
Pearson r of the uncensored runs alone beside the study's r (checked against numpy)."""

from __future__ import annotations

import matplotlib
import numpy as np

matplotlib.use("Agg")
from matplotlib.figure import Figure  # noqa: E402

from dynlab.tracking.figures.panels import tcross_mp_scatter, uncensored_pearson  # noqa: E402

from helpers.figure_data import HORIZON, N_FREE, N_STACK  # noqa: E402
from helpers.figure_data import censored_dataset as _dataset  # noqa: E402


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
    """The legend counts the censored runs and its title gives r over all runs and r over
    the uncensored ones; ``×29`` beside the stack."""
    ds, tc, mp = _dataset()
    ax = tcross_mp_scatter(ds, Figure(figsize=(3.4, 2.5)).add_subplot())
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert f"censored (at its bound): {N_STACK}" in labels
    notes = [t.get_text() for t in ax.texts]
    assert notes == [f"×{N_STACK}"]  # the 29 runs on one point are said to be 29
    stats = ax.get_legend().get_title().get_text()  # the statistics head the legend
    assert stats.startswith("all, censored at bounds:\nr = 0.99")
    assert stats.endswith("\nuncensored only:\n" + uncensored_pearson(tc, mp).replace(", n = ", "\nn = "))
    open_points = [c for c in ax.collections if len(c.get_offsets()) and not np.asarray(c.get_facecolors()).size]
    assert sum(len(c.get_offsets()) for c in open_points) == N_STACK
    np.testing.assert_allclose(np.concatenate([c.get_offsets() for c in open_points]), [[HORIZON, HORIZON]] * N_STACK,
                               rtol=0, atol=1e-9)
