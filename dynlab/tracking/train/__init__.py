"""The training engine: devices, curriculum, optimisation, progress.

:mod:`dynlab.tracking.train.engine` holds what training is made of (result, model, loss, learning-rate
schedule, threads); :mod:`dynlab.tracking.train.ensemble` the one training loop (N trackers as a
stack; :func:`train_tracker` is an ensemble of one).
"""

from dynlab.runtime import DEVICE_CHOICES, NullProgress, Progress, make_progress, resolve_device, train_threads
from dynlab.tracking.train.engine import build_tracker, lr_at
from dynlab.training import TrainResult, cosine_lr
from dynlab.tracking.train.ensemble import train_ensemble, train_tracker

__all__ = [
    "DEVICE_CHOICES",
    "NullProgress",
    "Progress",
    "TrainResult",
    "build_tracker",
    "cosine_lr",
    "lr_at",
    "make_progress",
    "resolve_device",
    "train_ensemble",
    "train_threads",
    "train_tracker",
]
