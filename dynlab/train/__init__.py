"""The training engine: devices, curriculum, optimisation, progress."""

from dynlab.train.device import DEVICE_CHOICES, resolve_device
from dynlab.train.engine import TrainResult, build_tracker, lr_at, train_tracker
from dynlab.train.progress import NullProgress, Progress, make_progress

__all__ = [
    "DEVICE_CHOICES",
    "NullProgress",
    "Progress",
    "TrainResult",
    "build_tracker",
    "lr_at",
    "make_progress",
    "resolve_device",
    "train_tracker",
]
