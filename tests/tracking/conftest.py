"""Fixtures of the tracking tests: an exact S3 tracker, the learning rates AdamW used."""

from __future__ import annotations

import pytest
import torch

from dynlab.tracking.models import Tracker
from helpers.trackers import exact_tracker


@pytest.fixture
def exact_s3() -> Tracker:
    return exact_tracker("S3")


@pytest.fixture
def used_lrs(monkeypatch) -> list[float]:
    """The learning rate AdamW used at every ``step`` call of the test, in order."""
    used: list[float] = []
    step = torch.optim.AdamW.step

    def recording_step(self, *a, **k):
        used.append(self.param_groups[0]["lr"])
        return step(self, *a, **k)

    monkeypatch.setattr(torch.optim.AdamW, "step", recording_step)
    return used
