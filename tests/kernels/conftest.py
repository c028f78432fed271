"""Fixtures of the kernel tests: buffers poisoned with NaN."""

from __future__ import annotations

import pytest
import torch


@pytest.fixture
def nan_buffers(monkeypatch):
    """Call it to make every buffer a kernel allocates start as NaN (``torch.empty``,
    ``Tensor.new_empty``) and to empty the fused kernels' reuse cache, so that an entry a
    kernel forgets to write shows up in its outputs (docs/choices.md, "Poisoned buffers").  The cache
    is emptied again afterwards, so no NaN buffer outlives the test."""
    from dynlab.kernels.tracker_loss.common import BUFFERS

    def poison() -> None:
        empty, new_empty = torch.empty, torch.Tensor.new_empty
        monkeypatch.setattr(torch, "empty", lambda *a, **k: empty(*a, **k).fill_(float("nan")))
        monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *a, **k: new_empty(self, *a, **k).fill_(float("nan")))
        BUFFERS.clear()

    yield poison
    BUFFERS.clear()
