"""The state preset's figure draws the map's values and the T_forget line where the rule puts it."""

from __future__ import annotations

import numpy as np
from matplotlib.figure import Figure

from dynlab.lm.figures.forget import forget_horizon_panel, forget_map_panel
from helpers.figure_data import forget_dataset

_dataset = forget_dataset


def test_the_map_shows_far_in_and_the_threshold_line():
    ax = Figure().add_subplot()
    forget_map_panel(_dataset(), ax)
    image = ax.get_images()[0].get_array()
    assert image.shape == (3, 5) and np.isclose(image[0, 0], 1.3) and np.isclose(image[0, 1], 1.01)
    line, arrows = ax.get_lines()
    # the boundary before T_forget: 32 -> between cells 0 and 1; 64 -> 1.5; censored above -> the right edge
    assert line.get_xdata().tolist() == [0.5, 1.5, 4.5] and line.get_ydata().tolist() == [0, 1, 2]
    # the censored threshold also gets an arrow on the right edge, and the title says what it means
    assert arrows.get_marker() == ">" and arrows.get_xdata() == [4.5] and arrows.get_ydata() == [2]
    assert "▶ censored, > 256" in ax.get_title() and "◀" not in ax.get_title()
    assert "1/2" not in {t.get_text().split("\n")[1] for t in ax.texts}  # seeds agree here: 0/2 or 2/2


def test_the_horizon_map_is_relative_to_the_training_length():
    ax = Figure().add_subplot()
    forget_horizon_panel(_dataset(), ax)
    image = ax.get_images()[0].get_array()
    assert np.isclose(image[0, 0], 1024 / 8 / 16) and np.isclose(image[2, 4], 16384 / 8 / 256)
