"""The training engine: devices, curriculum, optimisation, progress.

:mod:`dynlab.tracking.train.engine` holds what training is made of (result, model, loss, learning-rate
schedule, threads); :mod:`dynlab.tracking.train.ensemble` the one training loop (N trackers as a
stack; :func:`train_tracker` is an ensemble of one).

The public names below are imported on first use (as in :mod:`dynlab`), so that
:mod:`dynlab.tracking.train.budget` loads without torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from dynlab._lazy import lazy_exports

if TYPE_CHECKING:  # what _EXPORTS names, for type checkers and benchmarks/import_graph.py
    from dynlab.runtime import DEVICE_CHOICES, NullProgress, Progress, make_progress, resolve_device, train_threads
    from dynlab.tracking.train.engine import build_tracker, lr_at
    from dynlab.training import TrainResult, cosine_lr
    from dynlab.tracking.train.ensemble import train_ensemble, train_tracker

#: Public name -> the module that defines it, imported when the name is first read.
_EXPORTS = {
    "DEVICE_CHOICES": "dynlab.runtime",
    "NullProgress": "dynlab.runtime",
    "Progress": "dynlab.runtime",
    "TrainResult": "dynlab.training",
    "build_tracker": "dynlab.tracking.train.engine",
    "cosine_lr": "dynlab.training",
    "lr_at": "dynlab.tracking.train.engine",
    "make_progress": "dynlab.runtime",
    "resolve_device": "dynlab.runtime",
    "train_ensemble": "dynlab.tracking.train.ensemble",
    "train_threads": "dynlab.runtime",
    "train_tracker": "dynlab.tracking.train.ensemble",
}

__all__ = list(_EXPORTS)


__getattr__, __dir__ = lazy_exports(__name__, _EXPORTS, __all__)
