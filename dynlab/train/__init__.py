"""The training engine: devices, curriculum, optimisation, progress.

:mod:`dynlab.train.engine` holds what training is made of (result, model, loss, learning-rate
schedule, threads); :mod:`dynlab.train.ensemble` the one training loop (N trackers as a
stack; :func:`train_tracker` is an ensemble of one).
"""

from dynlab.runtime import DEVICE_CHOICES, NullProgress, Progress, make_progress, resolve_device, train_threads
from dynlab.train.engine import TrainResult, build_tracker, cosine_lr, lr_at
from dynlab.train.ensemble import train_ensemble, train_tracker

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
